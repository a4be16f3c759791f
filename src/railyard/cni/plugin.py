"""The CNI verbs: move exactly this pod's granted NICs into its netns, named by pair order.

`Plugin.handle(env, stdin)` is one CNI call as a runtime makes it; it answers (exit code,
stdout, stderr) and never raises. The service runs it warm behind the shim; standalone mode
runs it in the shim's own process. Devices come only from `Grants` (the node state store);
each device crosses between namespaces under a recorded transit name (one kernel move each
way, decision 0047), so a name clash on either side cannot leave a device half-moved, and any
failure mid-ADD puts every device back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import traceback
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from railyard.allocation.types import NicRef
from railyard.cni import devices
from railyard.cni.grants import Grant, Grants, PodDevices, confirm
from railyard.cni.ipam import Ipam, IpamCall
from railyard.cni.netns import (
    RESTORED_FLAGS,
    Link,
    LinkError,
    Links,
    NetlinkFailure,
    Netns,
    NetnsError,
    netns_identity,
)
from railyard.cni.rdma import RdmaError, RdmaNetns
from railyard.cni.restore import (
    Problems,
    fresh_transit_name,
    move_in,
    owns,
    put_back,
    transit_name,
)
from railyard.cni.spec import (
    LATEST_VERSION,
    SUPPORTED_VERSIONS,
    VALID_ATTACHMENTS,
    VALID_ATTACHMENTS_OLD,
    Call,
    CniError,
    Code,
    IpamResult,
    NetConf,
    ResultInterface,
    build_result,
    check_ifname,
    load_config,
    pair_ifnames,
    parse_env,
    parse_ipam_result,
    parse_netconf,
    reply_version,
    version_key,
)
from railyard.node.attachments import (
    AttachmentRecord,
    AttachmentStore,
    DeviceBusy,
    InUse,
    MovedDevice,
)
from railyard.node.errors import StateError
from railyard.node.files import write_atomic
from railyard.node.locks import FileLocks
from railyard.node.paths import CNI_DEVINFO_DIR

log = logging.getLogger(__name__)

# IPAM plugins that never enter the pod's netns, so they may run while devices still move
# (dhcp, for one, runs its client inside the netns and must wait for the interface).
NETNS_FREE_IPAM = frozenset({"host-local", "static", "whereabouts"})


def state_failure(e: StateError) -> CniError:
    """The node's state folder could not be read or written: an I/O failure (code 5)."""
    return CniError(Code.IO, str(e))


@dataclass(frozen=True, slots=True)
class Settings:
    """Node-side settings. Never read from a network config: whoever writes one (a namespace
    user, through a NetworkAttachmentDefinition) must not choose where devices are looked up."""

    sysfs_root: str = "/"
    host_netns: str | None = None  # None: the service's own namespace
    device_info_dir: str = CNI_DEVINFO_DIR
    lock_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Reply:
    code: int
    stdout: bytes = b""
    stderr: bytes = b""


class Plugin:
    """The CNI verbs over one node: its state store (grants), sysfs, netns and IPAM plugins.

    Thread-safe: each call runs on its caller's thread; calls touching the same device
    serialise on that device's lock.
    """

    def __init__(self, state_dir: str, grants: Grants, rdma: RdmaNetns, *,
                 settings: Settings | None = None, pod_devices: PodDevices | None = None,
                 ipam: Ipam | None = None) -> None:
        self.settings = settings or Settings()
        self.store = AttachmentStore(state_dir)
        self.grants = grants
        self.rdma = rdma
        self.pod_devices = pod_devices
        self.ipam = ipam or Ipam()
        # Asked once at start: the kernel's mode changes only while no other netns exists.
        self.rdma_mode = rdma.mode()
        self.host = (Netns.open(self.settings.host_netns) if self.settings.host_netns
                     else Netns.current())
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="railyard-ipam")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.host.close()

    # ------------------------------------------------------------------ entry

    def handle(self, env: Mapping[str, str], stdin: bytes) -> Reply:
        version = LATEST_VERSION
        try:
            call = parse_env(env)
            if call.command == "VERSION":
                return self._version(stdin)
            data = load_config(stdin)
            version = reply_version(data)
            conf = parse_netconf(data)
            if call.command in ("GC", "STATUS") and version_key(conf.version) < (1, 1, 0):
                raise CniError(Code.INCOMPATIBLE_VERSION,
                               f"{call.command} needs cniVersion 1.1.0, the config has "
                               f"{conf.version}")
            out = getattr(self, f"_{call.command.lower()}")(call, conf)
            return Reply(0, (json.dumps(out) + "\n").encode() if out is not None else b"")
        except CniError as e:
            return Reply(1, (json.dumps(e.to_json(version)) + "\n").encode())
        except StateError as e:  # the node's state folder failed us mid-call
            err = state_failure(e)
            return Reply(1, (json.dumps(err.to_json(version)) + "\n").encode())
        except Exception as e:  # never a traceback to the runtime; the log keeps it
            log.error("cni: unexpected failure\n%s", traceback.format_exc())
            err = CniError(Code.IO, f"internal error: {type(e).__name__}: {e}")
            return Reply(1, (json.dumps(err.to_json(version)) + "\n").encode(),
                         traceback.format_exc().encode())

    def _version(self, stdin: bytes) -> Reply:
        try:
            version = reply_version(load_config(stdin))
        except CniError:
            version = LATEST_VERSION
        out = {"cniVersion": version, "supportedVersions": list(SUPPORTED_VERSIONS)}
        return Reply(0, (json.dumps(out) + "\n").encode())

    # ------------------------------------------------------------------ ADD

    def _add(self, call: Call, conf: NetConf) -> dict:
        base = self._base_ifname(call, conf)
        if not (call.args.uid or (call.args.namespace and call.args.name)):
            raise CniError(Code.INVALID_ENV,
                           "CNI_ARGS: K8S_POD_UID, or K8S_POD_NAMESPACE and K8S_POD_NAME, are "
                           "needed to find the pod's devices")
        try:
            pod_ns = Netns.open(call.netns)
        except NetnsError as e:
            raise CniError(Code.UNKNOWN_CONTAINER, f"CNI_NETNS: {e.strerror}") from None
        with pod_ns:
            grant = self.grants.grant(call.args)
            if grant is None or not grant.nics:
                # Not a pod with Railyard NICs: pass the chain's result through untouched.
                return build_result(conf.version, conf.prev_result, [], [])
            nics = grant.nics
            confirm(nics, grant.pod, self.pod_devices)
            names = pair_ifnames(base, len(nics))
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
            with self._lock([n.pci_address for n in nics]):
                return self._add_locked(call, conf, pod_ns, grant, names)

    def _lock(self, pcis: list[str]) -> FileLocks:
        """The devices' locks, held by the caller's `with`; busy past the timeout: code 11."""
        try:
            return self.store.lock_devices(pcis, self.settings.lock_timeout_s)
        except DeviceBusy as e:
            raise CniError(Code.TRY_AGAIN, e.reason) from None

    def _base_ifname(self, call: Call, conf: NetConf) -> str:
        own = conf.raw.get("ifname")
        if own is None:
            return call.ifname
        if not isinstance(own, str):
            raise CniError(Code.INVALID_CONFIG, "ifname: expected an interface name")
        try:
            return check_ifname(own, "ifname")
        except CniError as e:
            raise CniError(Code.INVALID_CONFIG, e.msg) from None

    def _add_locked(self, call: Call, conf: NetConf, pod_ns: Netns, grant: Grant,
                    names: tuple[str, ...]) -> dict:
        nics = grant.nics
        if self.store.load(conf.name, call.container_id, call.ifname) is not None:
            raise CniError(Code.ATTACHMENT_EXISTS,
                           f"attachment ({call.container_id}, {call.ifname}) of network "
                           f"{conf.name} already exists; DEL it first")
        rec = AttachmentRecord(
            network=conf.name, container_id=call.container_id, ifname=call.ifname,
            netns=call.netns, netns_id=pod_ns.identity(), pod_uid=grant.pod.uid,
            pod_namespace=grant.pod.namespace, pod_name=grant.pod.name,
            cni_args=call.args_text, cni_path=list(call.path),
            ipam_conf={k: v for k, v in conf.raw.items() if k != "prevResult"},
        )
        with self.host.links() as host, pod_ns.links() as pod:
            for i, (nic, name) in enumerate(zip(nics, names, strict=True)):
                rec.devices.append(self._plan(host, nic, name, i, conf, rec))
            present = {n for link in pod.all() for n in (link.name, *link.altnames)}
            clash = [n for n in names if n in present]
            if clash:
                raise CniError(Code.MOVE_FAILED,
                               f"the pod's network namespace already has an interface named "
                               f"{clash[0]!r}", "nothing was moved")
            # The record is on disk before anything moves: after a crash at any later point,
            # DEL (which a runtime sends after a failed ADD) has all it needs.
            self.store.save(rec)
            note = InUse(network=rec.network, container_id=rec.container_id, ifname=rec.ifname,
                         netns=rec.netns, netns_id=rec.netns_id)
            for d in rec.devices:
                self.store.mark_in_use(d.pci, note)
            pending: list[Future | None] = []
            try:
                # IPAM that never enters the pod's netns runs while the devices move (the
                # moves are the slow part: the kernel serialises them, ~20 ms each on VMs).
                early = all(conf.interface(i).ipam is None or
                            conf.interface(i).ipam["type"] in NETNS_FREE_IPAM
                            for i in range(len(rec.devices)))
                if early:
                    pending = self._start_ipam(call, conf, rec)
                links = self._move_in(host, pod, pod_ns, rec, conf)
                if not early:
                    pending = self._start_ipam(call, conf, rec)
                ipams = self._finish_ipam(pending, rec)
                for d, ipam in zip(rec.devices, ipams, strict=True):
                    if ipam is not None:
                        self._configure_ips(pod, links[d.ifname], ipam)
                self._write_device_info(call, conf, rec)
                result = build_result(conf.version, conf.prev_result, [
                    ResultInterface(d.ifname, links[d.ifname].mac or "", call.netns,
                                    links[d.ifname].mtu, d.pci)
                    for d in rec.devices
                ], ipams)
                rec.state = "added"
                self.store.save(rec)
            except BaseException as e:
                wait([f for f in pending if f is not None])  # IPAM DEL only after its ADD
                problems = self._teardown(rec, pod_ns, call.path, host, pod)
                if problems:
                    self.store.save(rec)  # DEL finishes what the rollback could not
                else:
                    self._forget(rec)
                if isinstance(e, CniError):
                    err = e
                elif isinstance(e, StateError):
                    err = state_failure(e)
                elif isinstance(e, (LinkError, RdmaError)):
                    err = CniError(Code.MOVE_FAILED, str(e))
                else:
                    raise
                outcome = ("rollback incomplete: " + "; ".join(problems.items) if problems
                           else "rolled back: every device is back in the host namespace")
                err.details = f"{err.details}; {outcome}" if err.details else outcome
                raise err from None
        return result

    def _plan(self, host: Links, nic: NicRef, name: str, i: int, conf: NetConf,
              rec: AttachmentRecord) -> MovedDevice:
        """Check one granted device is free and in the host namespace; note its originals."""
        pci = nic.pci_address
        note = self.store.in_use(pci)
        other = note is not None and (note.network, note.container_id, note.ifname) != (
            rec.network, rec.container_id, rec.ifname)
        if other and note.netns_id is not None and \
                netns_identity(note.netns) == tuple(note.netns_id):
            raise CniError(Code.DEVICE_UNAVAILABLE,
                           f"{nic.kind.upper()} {pci} is in use by container "
                           f"{note.container_id} ({note.ifname}) whose network namespace "
                           f"{note.netns} still exists")
        netdev = devices.netdev_of(self.settings.sysfs_root, pci)
        link = host.get(netdev) if netdev else None
        if link is None:
            raise CniError(Code.DEVICE_UNAVAILABLE,
                           f"{nic.kind.upper()} {pci} has no netdev in the host network "
                           "namespace (held by another pod, or its driver is not bound)")
        if link.parent is not None and self.settings.sysfs_root == "/" and link.parent != pci:
            # The kernel names the netdev's parent device: believe it over a path lookup.
            raise CniError(Code.DEVICE_UNAVAILABLE,
                           f"netdev {link.name} belongs to {link.parent}, not to {pci}")
        ifc = conf.interface(i)
        # Only sysfs says which RDMA device is this function's: a name from the record (which
        # a pod's own annotation can seed) could be another pod's device.
        rdma_dev = devices.rdma_device_of(self.settings.sysfs_root, pci)
        return MovedDevice(
            pci=pci, kind=nic.kind, ifname=name, original_name=link.name,
            original_mac=link.mac, original_mtu=link.mtu, original_up=link.up, mac_set=ifc.mac,
            rdma_device=rdma_dev, ipam_type=ifc.ipam["type"] if ifc.ipam else None,
            original_parent=link.parent, original_altnames=list(link.altnames),
            original_flags=link.flags & RESTORED_FLAGS, original_txqlen=link.txqlen,
            original_group=link.group, original_alias=link.alias,
            transit_names=[transit_name()],
        )

    def _move_in(self, host: Links, pod: Links, pod_ns: Netns, rec: AttachmentRecord,
                 conf: NetConf) -> dict[str, Link]:
        """Each device host → pod under its transit name, then named, configured and up."""
        out = {}
        for i, d in enumerate(rec.devices):
            if d.rdma_device and self.rdma_mode == "exclusive":
                # Before the netdev: an IPoIB netdev may only follow its RDMA device. Noted
                # first: a crash after the move must leave a record that undoes it (the undo
                # checks where the device is, so a note without the move is harmless).
                d.rdma_moved = True
                self.store.save(rec)
                self.rdma.move(d.rdma_device, self.host, pod_ns)
            ifc = conf.interface(i)
            out[d.ifname] = move_in(host, pod, pod_ns, d, mtu=ifc.mtu, mac=ifc.mac)
            d.pod_index = out[d.ifname].index  # on disk with the record's next save
        return out

    def _start_ipam(self, call: Call, conf: NetConf,
                    rec: AttachmentRecord) -> list[Future | None]:
        """IPAM ADD per interface, concurrently; each call is noted on disk before it is made."""
        jobs: list[tuple[str, str, Mapping[str, Any], MovedDevice] | None] = []
        for i, d in enumerate(rec.devices):
            ipam = conf.interface(i).ipam
            if ipam is None:
                jobs.append(None)
                continue
            exe = self.ipam.find(ipam["type"], call.path)
            version = self.ipam.version_for(exe, conf.version)
            if version is None:
                raise CniError(Code.INCOMPATIBLE_VERSION,
                               f"IPAM plugin {ipam['type']} speaks no version from 0.3.0 up to "
                               f"{conf.version}")
            d.ipam_version = version
            d.ipam_started = True
            jobs.append((exe, version, ipam, d))
        if any(jobs):
            self.store.save(rec)
        return [
            None if job is None else self._pool.submit(
                self.ipam.add, job[0], job[1], conf.raw, job[2],
                IpamCall(call.container_id, call.netns, job[3].ifname, call.args_text,
                         call.path))
            for job in jobs
        ]

    def _finish_ipam(self, pending: list[Future | None],
                     rec: AttachmentRecord) -> list[IpamResult | None]:
        """Every IPAM answer, in interface order; the first failure after all have ended."""
        results: list[IpamResult | None] = []
        first_error: BaseException | None = None
        for f, d in zip(pending, rec.devices, strict=True):
            if f is None:
                results.append(None)
                continue
            try:
                res, raw = f.result()
                d.ipam_result = raw
                results.append(res)
            except BaseException as e:  # wait for every call before failing
                results.append(None)
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return results

    def _configure_ips(self, pod: Links, link: Link, ipam: IpamResult) -> None:
        gateways: dict[int, str] = {}
        for address, gateway in ipam.ips:
            pod.add_address(link, address)
            if gateway:
                gateways.setdefault(6 if ":" in address else 4, gateway)
        for r in ipam.routes:
            gw = r.get("gw") or gateways.get(6 if ":" in r["dst"] else 4)
            pod.add_route(link, r["dst"], gw)

    def _write_device_info(self, call: Call, conf: NetConf, rec: AttachmentRecord) -> None:
        """Multus's device-info file per interface: `{"type": "pci", "pci": {…}}`."""
        folder = os.path.realpath(self.settings.device_info_dir)
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

    # ------------------------------------------------------------------ putting back

    def _teardown(self, rec: AttachmentRecord, pod_ns: Netns | None, path: tuple[str, ...],
                  host: Links | None = None, pod: Links | None = None) -> Problems:
        """Every device back in the host under its original name, MAC and MTU; IPAM released.

        Works from whatever state a crash (or the pod) left: each device is looked for among
        the pod's links by identity, in the host under a transit or fallback name, or wherever
        sysfs says its netdev is now.
        """
        problems = Problems()
        for d in rec.devices:
            fresh_transit_name(d)
        self.store.save(rec)  # this attempt's names, on disk before any is used
        # IPAM DEL runs while the devices move back (both are slow, neither needs the other).
        releases = self._release_ipam(rec, path or tuple(rec.cni_path))
        with contextlib.ExitStack() as stack:
            if host is None:
                host = stack.enter_context(self.host.links())
            if pod is None and pod_ns is not None:
                pod = stack.enter_context(pod_ns.links())
            pod_links = self._links_or_none(pod, problems)
            for d in reversed(rec.devices):
                put_back(d, pod=pod if pod_links is not None else None,
                         pod_links=pod_links or [], host=host, host_ns=self.host,
                         sysfs_root=self.settings.sysfs_root, problems=problems)
                if d.rdma_moved:
                    self._rdma_back(d, pod_ns, problems)
                    if not d.rdma_moved:
                        self.store.save(rec)  # a crash later must not move it "back" again
        for d, f in releases:
            try:
                f.result()
                d.ipam_started = False
            except CniError as e:
                problems.add(e.msg)
        for d in rec.devices:
            if d.device_info_path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(d.device_info_path)
                d.device_info_path = None
        return problems

    @staticmethod
    def _links_or_none(pod: Links | None, problems: Problems) -> list[Link] | None:
        """The pod's links, one dump for every device; None (and a problem, so DEL is retried
        rather than answered) when the pod's namespace cannot be listed."""
        if pod is None:
            return None
        try:
            return pod.all()
        except (NetlinkFailure, OSError) as e:
            problems.add(f"listing the links of {pod.netns.label}: {e}")
            return None

    def _rdma_back(self, d: MovedDevice, pod_ns: Netns | None, problems: Problems) -> None:
        """The device's RDMA device home; done already (a repeated DEL) counts as done."""
        if pod_ns is None:
            d.rdma_moved = False  # the kernel returns an RDMA device when its netns dies
            return
        device = d.rdma_device or ""
        try:
            if not self.rdma.holds(device, self.host):
                self.rdma.move(device, pod_ns, self.host)
            d.rdma_moved = False
        except RdmaError as e:
            problems.add(str(e))

    def _release_ipam(self, rec: AttachmentRecord,
                      path: tuple[str, ...]) -> list[tuple[MovedDevice, Future]]:
        """IPAM DEL for every interface whose ADD was called, started concurrently."""
        base = rec.ipam_conf or {}
        out = []
        for i, d in enumerate(rec.devices):
            if not d.ipam_started:
                continue
            ipam = self._ipam_of(base, i)
            if ipam is None:
                d.ipam_started = False
                continue
            out.append((d, self._pool.submit(self._ipam_del, ipam, d, rec, base, path)))
        return out

    def _ipam_del(self, ipam: Mapping[str, Any], d: MovedDevice, rec: AttachmentRecord,
                  base: Mapping[str, Any], path: tuple[str, ...]) -> None:
        exe = self.ipam.find(ipam["type"], path)
        self.ipam.delete(exe, d.ipam_version or "0.4.0", base, ipam,
                         IpamCall(rec.container_id, rec.netns, d.ifname, rec.cni_args, path))

    @staticmethod
    def _ipam_of(base: Mapping[str, Any], i: int) -> Mapping[str, Any] | None:
        ifs = base.get("interfaces") or []
        own = ifs[i].get("ipam") if i < len(ifs) and isinstance(ifs[i], dict) else None
        return own or base.get("ipam") or None

    def _forget(self, rec: AttachmentRecord) -> None:
        for d in rec.devices:
            self.store.clear_in_use(d.pci, rec)
        self.store.remove(rec)

    # ------------------------------------------------------------------ DEL, CHECK, GC, STATUS

    def _del(self, call: Call, conf: NetConf) -> None:
        rec = self.store.load(conf.name, call.container_id, call.ifname)
        if rec is None:
            return None  # never added, or already deleted: success (DEL is idempotent)
        self._delete_record(rec, call.path)
        return None

    def _delete_record(self, rec: AttachmentRecord, path: tuple[str, ...]) -> None:
        with self._lock([d.pci for d in rec.devices]):
            # Read again under the locks: an ADD still running when this call read the record
            # has since finished it (its IPAM calls, its device-info files), or a DEL has.
            rec = self.store.load(rec.network, rec.container_id, rec.ifname)
            if rec is None:
                return
            pod_ns = self._open_recorded(rec)
            try:
                problems = self._teardown(rec, pod_ns, path)
            finally:
                if pod_ns is not None:
                    pod_ns.close()
            if problems:
                self.store.save(rec)
                raise CniError(Code.MOVE_FAILED,
                               f"DEL of ({rec.container_id}, {rec.ifname}) incomplete",
                               "; ".join(problems.items))
            self._forget(rec)

    @staticmethod
    def _open_recorded(rec: AttachmentRecord) -> Netns | None:
        """The pod's namespace if the recorded path still names the same namespace."""
        if rec.netns_id is None or netns_identity(rec.netns) != tuple(rec.netns_id):
            return None
        try:
            return Netns.open(rec.netns)
        except NetnsError:
            return None

    def _check(self, call: Call, conf: NetConf) -> None:
        rec = self.store.load(conf.name, call.container_id, call.ifname)
        if rec is None:
            grant = self.grants.grant(call.args)
            if grant is not None and grant.nics:
                raise CniError(Code.CHECK_FAILED,
                               f"no attachment ({call.container_id}, {call.ifname}) recorded")
            return None
        if rec.state != "added":
            raise CniError(Code.CHECK_FAILED, "the attachment's ADD did not complete")
        pod_ns = self._open_recorded(rec)
        if pod_ns is None:
            raise CniError(Code.CHECK_FAILED, f"network namespace {rec.netns} is gone")
        prev_names = {i.get("name") for i in (conf.prev_result or {}).get("interfaces") or []
                      if isinstance(i, dict)}
        with pod_ns, pod_ns.links() as pod:
            for i, d in enumerate(rec.devices):
                link = pod.get(d.ifname)
                if link is None:
                    raise CniError(Code.CHECK_FAILED, f"{d.ifname} ({d.pci}) is not in the pod")
                if not owns(link, d, in_pod=True):
                    raise CniError(Code.CHECK_FAILED, f"{d.ifname} is not {d.pci}")
                if not link.up:
                    raise CniError(Code.CHECK_FAILED, f"{d.ifname} is down")
                ifc = conf.interface(i)
                if ifc.mtu and link.mtu != ifc.mtu:
                    raise CniError(Code.CHECK_FAILED,
                                   f"{d.ifname} has MTU {link.mtu}, configured {ifc.mtu}")
                if ifc.mac and (link.mac or "").lower() != ifc.mac:
                    raise CniError(Code.CHECK_FAILED,
                                   f"{d.ifname} has MAC {link.mac}, configured {ifc.mac}")
                if conf.prev_result is not None and d.ifname not in prev_names:
                    raise CniError(Code.CHECK_FAILED, f"{d.ifname} is missing from prevResult")
                if d.ipam_result:
                    want = {a for a, _ in parse_ipam_result(d.ipam_result, "cached").ips}
                    have = pod.addresses(link)
                    missing = sorted(want - have)
                    if missing:
                        raise CniError(Code.CHECK_FAILED,
                                       f"{d.ifname} lacks address {missing[0]}")
                if ifc.ipam and d.ipam_version and version_key(d.ipam_version) >= (0, 4, 0):
                    exe = self.ipam.find(ifc.ipam["type"], call.path)
                    self.ipam.check(exe, d.ipam_version, conf.raw, ifc.ipam,
                                    IpamCall(call.container_id, call.netns, d.ifname,
                                             call.args_text, call.path),
                                    d.ipam_result)  # its own ADD result, in its own version
        return None

    def _gc(self, call: Call, conf: NetConf) -> None:
        if conf.valid_attachments is None:
            # Read as "none is valid" it would tear down every attachment of the network.
            raise CniError(Code.INVALID_CONFIG,
                           f"GC needs {VALID_ATTACHMENTS} (the attachments to keep); "
                           "nothing was removed")
        valid = {(a.container_id, a.ifname) for a in conf.valid_attachments}
        # IPAM ran once per interface under that interface's own name: it must hear those.
        keep = [{"containerID": a.container_id, "ifname": a.ifname}
                for a in conf.valid_attachments]
        problems = []
        for rec in self.store.records(conf.name):
            if (rec.container_id, rec.ifname) in valid:
                keep.extend({"containerID": rec.container_id, "ifname": d.ifname}
                            for d in rec.devices if d.ifname != rec.ifname)
                continue
            try:
                self._delete_record(rec, call.path)
            except (CniError, StateError) as e:
                err = e if isinstance(e, CniError) else state_failure(e)
                problems.append(f"{err.msg}: {err.details}")
        for pci, note in self.store.in_use_notes():
            # A note whose attachment is gone and whose namespace died protects nothing.
            if note.network == conf.name and \
                    self.store.load(note.network, note.container_id, note.ifname) is None and \
                    (note.netns_id is None or netns_identity(note.netns) != tuple(note.netns_id)):
                self.store.drop_in_use(pci)
        for ipam in {json.dumps(i, sort_keys=True) for i in self._ipams(conf)}:
            spec = json.loads(ipam)
            exe = self.ipam.find(spec["type"], call.path)
            self.ipam.gc_or_status(exe, "GC", conf.raw, spec, call.path,
                                   {VALID_ATTACHMENTS: keep, VALID_ATTACHMENTS_OLD: keep})
        if problems:
            raise CniError(Code.MOVE_FAILED, "GC incomplete", "; ".join(problems))
        return None

    def _status(self, call: Call, conf: NetConf) -> None:
        if not os.access(self.store.root, os.W_OK):
            raise CniError(Code.NOT_AVAILABLE, f"state folder {self.store.root} is not writable")
        for ipam in {json.dumps(i, sort_keys=True) for i in self._ipams(conf)}:
            spec = json.loads(ipam)
            try:
                exe = self.ipam.find(spec["type"], call.path)
            except CniError as e:
                raise CniError(Code.NOT_AVAILABLE, e.msg) from None
            self.ipam.gc_or_status(exe, "STATUS", conf.raw, spec, call.path)
        return None

    @staticmethod
    def _ipams(conf: NetConf) -> list[Mapping[str, Any]]:
        out = [i.ipam for i in conf.interfaces if i.ipam]
        if conf.ipam:
            out.append(conf.ipam)
        return out
