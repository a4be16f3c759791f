"""CNI ADD: move exactly the pod's granted NICs into its netns, named in pair order.

Devices come only from the grants (the node state store, confirmed by kubelet when it
answers). The record is on disk before anything moves, and any failure mid-ADD puts every
device back (moves.put_all_back), so a runtime's DEL after a failed ADD finds nothing or
finishes what the rollback could not.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, wait
from typing import Any

from railyard.cni import addresses, moves, records
from railyard.cni.context import NodeContext, PodInterface
from railyard.cni.grants import Grant, confirm
from railyard.cni.netns import Link, LinkError, Netns, NetnsError, netns_identity
from railyard.cni.rdma import RdmaError
from railyard.cni.spec import (
    Call,
    CniError,
    Code,
    NetConf,
    ResultInterface,
    build_result,
    check_ifname,
    pair_ifnames,
)
from railyard.node.attachments import AttachmentRecord
from railyard.node.errors import StateError
from railyard.node.files import write_atomic


def add(node: NodeContext, call: Call, conf: NetConf) -> dict:
    """The call checked; under the attachment's lock, the pod's grant found and confirmed,
    then the ADD under its devices' locks."""
    base = _base_ifname(call, conf)
    if not (call.args.uid or (call.args.namespace and call.args.name)):
        raise CniError(Code.INVALID_ENV,
                       "CNI_ARGS: K8S_POD_UID, or K8S_POD_NAMESPACE and K8S_POD_NAME, are "
                       "needed to find the pod's devices")
    # Held until the answer, from before the grant lookup (which may wait seconds on kubelet
    # and the device locks): a DEL of this attachment waits for it instead of answering
    # "never added" while this ADD goes on to move devices.
    with records.hold(node, conf.name, call.container_id, call.ifname):
        return _add(node, call, conf, base)


def _add(node: NodeContext, call: Call, conf: NetConf, base: str) -> dict:
    try:
        pod_ns = Netns.open(call.netns)
    except NetnsError as e:
        raise CniError(Code.UNKNOWN_CONTAINER, f"CNI_NETNS: {e.strerror}") from None
    with pod_ns:
        if pod_ns.identity() in node.own_namespaces:
            # Moving "into" the host would rename its devices in place (issue 19, class 3).
            raise CniError(Code.INVALID_ENV,
                           f"CNI_NETNS {call.netns} is the host's own network namespace (the "
                           "CNI service's), not a pod's", "nothing was moved")
        grant = node.grants.grant(call.args)
        if grant is None or not grant.nics:
            # Not a pod with Railyard NICs: pass the chain's result through untouched.
            return build_result(conf.version, conf.prev_result, [], [])
        nics = grant.nics
        confirm(nics, grant.pod, node.pod_devices)
        names = pair_ifnames(base, len(nics), scheme=conf.ifname_scheme,
                             pair_indexes=grant.pair_indexes)
        taken = {i.get("name") for i in (conf.prev_result or {}).get("interfaces") or []
                 if isinstance(i, dict)}
        clash = [n for n in names if n in taken]
        if clash:
            raise CniError(Code.INVALID_CONFIG,
                           f"interface name {clash[0]!r} is already in prevResult; set "
                           "\"ifname\" in the config to name Railyard's interfaces")
        needs_ipam = conf.ipam is not None or any(i.ipam for i in conf.interfaces)
        if needs_ipam and not call.path:
            raise CniError(Code.INVALID_ENV, "CNI_PATH is required to find IPAM plugins")
        with records.lock(node, [n.pci_address for n in nics]):
            return _add_locked(node, call, conf, pod_ns, grant, names)


def _base_ifname(call: Call, conf: NetConf) -> str:
    own = conf.raw.get("ifname")
    if own is None:
        return call.ifname
    if not isinstance(own, str):
        raise CniError(Code.INVALID_CONFIG, "ifname: expected an interface name")
    try:
        return check_ifname(own, "ifname")
    except CniError as e:
        raise CniError(Code.INVALID_CONFIG, e.msg) from None


def _add_locked(node: NodeContext, call: Call, conf: NetConf, pod_ns: Netns, grant: Grant,
                names: tuple[str, ...]) -> dict:
    if node.store.load(conf.name, call.container_id, call.ifname) is not None:
        raise CniError(Code.ATTACHMENT_EXISTS,
                       f"attachment ({call.container_id}, {call.ifname}) of network "
                       f"{conf.name} already exists; DEL it first")
    rec = records.new_record(call, conf, pod_ns, grant)
    with node.host.links() as host, pod_ns.links() as pod:
        for i, (nic, name) in enumerate(zip(grant.nics, names, strict=True)):
            rec.devices.append(moves.plan_device(node, host, nic, name, i, conf, rec))
        present = {n for link in pod.all() for n in (link.name, *link.altnames)}
        clash = [n for n in names if n in present]
        if clash:
            raise CniError(Code.MOVE_FAILED,
                           f"the pod's network namespace already has an interface named "
                           f"{clash[0]!r}", "nothing was moved")
        if netns_identity(call.netns) != pod_ns.identity():
            # The runtime removed the namespace while this ADD waited (it gave up on the ADD):
            # only this ADD's handle keeps it alive, and devices moved there would come back
            # to the host under the pod's names when the handle closes.
            raise CniError(Code.UNKNOWN_CONTAINER,
                           f"CNI_NETNS {call.netns} no longer names the network namespace "
                           "this ADD opened (removed by the runtime meanwhile)",
                           "nothing was moved")
        # The record is on disk before anything moves: after a crash at any later point,
        # DEL (which a runtime sends after a failed ADD) has all it needs.
        node.store.save(rec)
        note = records.in_use_note(rec)
        for d in rec.devices:
            node.store.mark_in_use(d.pci, note)
        pending: list[Future | None] = []
        try:
            # IPAM that never enters the pod's netns runs while the devices move (the
            # moves are the slow part: the kernel serialises them, ~20 ms each on VMs).
            early = addresses.netns_free(conf, len(rec.devices))
            if early:
                pending = addresses.start(node, call, conf, rec)
            links = moves.move_all_in(node, host, pod, pod_ns, rec, conf)
            if not early:
                pending = addresses.start(node, call, conf, rec)
            ipams = addresses.finish(pending, rec)
            for d, ipam in zip(rec.devices, ipams, strict=True):
                if ipam is not None:
                    addresses.configure(pod, links[d.ifname], ipam)
            _write_device_info(node, call, conf, rec)
            result = build_result(conf.version, conf.prev_result,
                                  [_result_interface(call, d.ifname, d.pci, links[d.ifname])
                                   for d in rec.devices], ipams)
            rec.state = "added"
            node.store.save(rec)
        except BaseException as e:
            wait([f for f in pending if f is not None])  # IPAM DEL only after its ADD
            problems = moves.put_all_back(node, rec, pod_ns, call.path, host, pod)
            if problems:
                node.store.save(rec)  # DEL finishes what the rollback could not
            else:
                records.forget(node, rec)
            if isinstance(e, CniError):
                err = e
            elif isinstance(e, StateError):
                err = records.state_failure(e)
            elif isinstance(e, (LinkError, RdmaError)):
                err = CniError(Code.MOVE_FAILED, str(e))
            else:
                raise
            outcome = ("rollback incomplete: " + "; ".join(problems.items) if problems
                       else "rolled back: every device is back in the host namespace")
            err.details = f"{err.details}; {outcome}" if err.details else outcome
            raise err from None
    node.added(grant.pod, tuple(
        PodInterface(d.pci, d.ifname, links[d.ifname].mac or "",
                     tuple(address for address, _ in ipam.ips) if ipam is not None else ())
        for d, ipam in zip(rec.devices, ipams, strict=True)))
    return result


def _result_interface(call: Call, ifname: str, pci: str, link: Link) -> ResultInterface:
    return ResultInterface(ifname, link.mac or "", call.netns, link.mtu, pci)


def _write_device_info(node: NodeContext, call: Call, conf: NetConf,
                       rec: AttachmentRecord) -> None:
    """Multus's device-info file per interface: `{"type": "pci", "pci": {…}}`."""
    folder = os.path.realpath(node.settings.device_info_dir)
    for i, d in enumerate(rec.devices):
        path = os.path.join(folder, f"{conf.name}-{call.container_id}-{d.ifname}"
                                    "-device-info.json")
        asked = conf.device_info_file
        if i == 0 and asked and os.path.dirname(os.path.realpath(asked)) == folder:
            path = os.path.realpath(asked)  # Multus chose the name; only inside its folder
        pci: dict[str, Any] = {"pci-address": d.pci}
        if d.rdma_device:
            pci["rdma-device"] = d.rdma_device
        body = json.dumps({"type": "pci", "version": "1.1.0", "pci": pci}).encode()
        try:
            os.makedirs(folder, exist_ok=True)
            write_atomic(path, body, mode=0o644)
        except OSError as e:
            raise CniError(Code.IO, f"device-info file {path}: {e.strerror}") from None
        d.device_info_path = path
