"""CNI CHECK: the attachment is still as ADD left it — each device in the pod under its name,
itself (not another link that took the name), up, with the configured MTU, MAC and addresses,
listed in prevResult — and each interface's IPAM agrees. The first difference is code 102.
"""

from __future__ import annotations

from railyard.cni import records
from railyard.cni.context import NodeContext
from railyard.cni.ipam import IpamCall
from railyard.cni.restore import owns
from railyard.cni.spec import Call, CniError, Code, NetConf, parse_ipam_result, version_key


def check(node: NodeContext, call: Call, conf: NetConf) -> None:
    rec = node.store.load(conf.name, call.container_id, call.ifname)
    if rec is None:
        grant = node.grants.grant(call.args)
        if grant is not None and grant.nics:
            raise CniError(Code.CHECK_FAILED,
                           f"no attachment ({call.container_id}, {call.ifname}) recorded")
        return None
    if rec.state != "added":
        raise CniError(Code.CHECK_FAILED, "the attachment's ADD did not complete")
    pod_ns = records.open_recorded(rec)
    if pod_ns is None:
        raise CniError(Code.CHECK_FAILED, f"network namespace {rec.netns} is gone")
    prev_names = {i.get("name") for i in (conf.prev_result or {}).get("interfaces") or []
                  if isinstance(i, dict)}
    with pod_ns, pod_ns.links() as pod:
        for i, d in enumerate(rec.devices):
            link = pod.get(d.ifname)
            if link is None:
                raise CniError(Code.CHECK_FAILED, f"{d.ifname} ({d.pci}) is not in the pod")
            # Asked after the link: showing a link whose peer is in the host assigns the id.
            if not owns(pod, link, d, in_pod=True, host_id=pod.id_of(node.host)):
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
                missing = sorted(want - pod.addresses(link))
                if missing:
                    raise CniError(Code.CHECK_FAILED, f"{d.ifname} lacks address {missing[0]}")
            if ifc.ipam and d.ipam_version and version_key(d.ipam_version) >= (0, 4, 0):
                exe = node.ipam.find(ifc.ipam["type"], call.path)
                node.ipam.check(exe, d.ipam_version, conf.raw, ifc.ipam,
                                IpamCall(call.container_id, call.netns, d.ifname,
                                         call.args_text, call.path),
                                d.ipam_result)  # its own ADD result, in its own version
    return None
