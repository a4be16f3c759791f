"""An attachment's IPAM: one delegated call per interface (ipam.py runs them), started on the
node's pool so they overlap each other and the devices' moves, each noted in the record before
it is made so DEL releases exactly what ADD leased; and the addresses configured from answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from railyard.cni.context import NodeContext
from railyard.cni.ipam import IpamCall
from railyard.cni.netns import Link, Links
from railyard.cni.spec import Call, CniError, Code, IpamResult, NetConf
from railyard.node.attachments import AttachmentRecord, MovedDevice

# IPAM plugins that never enter the pod's netns, so they may run while devices still move
# (dhcp, for one, runs its client inside the netns and must wait for the interface).
NETNS_FREE_IPAM = frozenset({"host-local", "static", "whereabouts"})


def netns_free(conf: NetConf, count: int) -> bool:
    """Whether every interface's IPAM (if any) may run before its device is in the pod."""
    ipams = [conf.interface(i).ipam for i in range(count)]
    return all(ipam is None or ipam["type"] in NETNS_FREE_IPAM for ipam in ipams)


def start(node: NodeContext, call: Call, conf: NetConf,
          rec: AttachmentRecord) -> list[Future | None]:
    """IPAM ADD per interface, concurrently; each call is noted on disk before it is made."""
    jobs: list[tuple[str, str, Mapping[str, Any], MovedDevice] | None] = []
    for i, d in enumerate(rec.devices):
        ipam = conf.interface(i).ipam
        if ipam is None:
            jobs.append(None)
            continue
        exe = node.ipam.find(ipam["type"], call.path)
        version = node.ipam.version_for(exe, conf.version)
        if version is None:
            raise CniError(Code.INCOMPATIBLE_VERSION,
                           f"IPAM plugin {ipam['type']} speaks no version from 0.3.0 up to "
                           f"{conf.version}")
        d.ipam_version = version
        d.ipam_started = True
        jobs.append((exe, version, ipam, d))
    if any(jobs):
        node.store.save(rec)
    return [
        None if job is None else node.pool.submit(
            node.ipam.add, job[0], job[1], conf.raw, job[2],
            IpamCall(call.container_id, call.netns, job[3].ifname, call.args_text, call.path))
        for job in jobs
    ]


def finish(pending: list[Future | None], rec: AttachmentRecord) -> list[IpamResult | None]:
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


def configure(pod: Links, link: Link, ipam: IpamResult) -> None:
    """The answer's addresses and routes on the pod's link; a route without a gateway takes
    the first gateway of its address family."""
    gateways: dict[int, str] = {}
    for address, gateway in ipam.ips:
        pod.add_address(link, address)
        if gateway:
            gateways.setdefault(6 if ":" in address else 4, gateway)
    for r in ipam.routes:
        gw = r.get("gw") or gateways.get(6 if ":" in r["dst"] else 4)
        pod.add_route(link, r["dst"], gw)


def release(node: NodeContext, rec: AttachmentRecord,
            path: tuple[str, ...]) -> list[tuple[MovedDevice, Future]]:
    """IPAM DEL for every interface whose ADD was called, started concurrently."""
    base = rec.ipam_conf or {}
    out = []
    for i, d in enumerate(rec.devices):
        if not d.ipam_started:
            continue
        ipam = ipam_of(base, i)
        if ipam is None:
            d.ipam_started = False
            continue
        out.append((d, node.pool.submit(_delete, node, ipam, d, rec, base, path)))
    return out


def _delete(node: NodeContext, ipam: Mapping[str, Any], d: MovedDevice, rec: AttachmentRecord,
            base: Mapping[str, Any], path: tuple[str, ...]) -> None:
    exe = node.ipam.find(ipam["type"], path)
    node.ipam.delete(exe, d.ipam_version or "0.4.0", base, ipam,
                     IpamCall(rec.container_id, rec.netns, d.ifname, rec.cni_args, path))


def ipam_of(base: Mapping[str, Any], i: int) -> Mapping[str, Any] | None:
    """Interface `i`'s IPAM in a recorded config: its own, else the network's."""
    ifs = base.get("interfaces") or []
    own = ifs[i].get("ipam") if i < len(ifs) and isinstance(ifs[i], dict) else None
    return own or base.get("ipam") or None


def distinct_ipams(conf: NetConf) -> list[Mapping[str, Any]]:
    """Each distinct IPAM config of the network (per-interface ones and the network's), once:
    GC and STATUS ask each plugin configuration once."""
    out = [i.ipam for i in conf.interfaces if i.ipam]
    if conf.ipam:
        out.append(conf.ipam)
    return [json.loads(s) for s in {json.dumps(i, sort_keys=True) for i in out}]
