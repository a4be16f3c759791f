"""Which devices each plugin offers, and how healthy they are right now.

`offered_devices` is pure: the topology, the pool selectors, the selector facts and the
netdevs carrying the default route decide what kubelet may hand out. `SysfsProbe` is the thin
reader behind it (facts, routes) and behind health: a short re-scan of a few files per device.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from railyard.discovery.sysfs import parse_default_route_ifaces, parse_port_state
from railyard.kubelet.resolver import Kind, pool_of
from railyard.kubelet.selectors import DeviceFacts, Selector, offered
from railyard.topology.model import Nic, NodeTopology

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


@dataclass(frozen=True, slots=True)
class PluginDevice:
    id: str
    kind: Kind
    pci_address: str
    numa_node: int | None
    pf_pci_address: str | None = None  # VFs: their PF


def _facts(nic: Nic, pci: str, vf_index: int | None, driver: str | None,
           facts: Mapping[str, DeviceFacts]) -> DeviceFacts:
    known = facts.get(pci)
    if known is not None:
        return known
    return DeviceFacts(pci, None, None, driver, nic.netdev, vf_index, nic.link_layer)


def offered_devices(topology: NodeTopology, kind: Kind, *, pool: tuple[Selector, ...] = (),
                    facts: Mapping[str, DeviceFacts] | None = None,
                    routed: frozenset[str] = frozenset()) -> tuple[PluginDevice, ...]:
    """The devices one plugin advertises.

    Never a PF or VF whose netdev carries the default route (the node would lose its
    network), never a VF bound to vfio-pci as an RDMA VF. A VF plugin (`kind` "vf" or
    another pool's resource name) offers only the VFs of its own pool (`Vf.pool`).
    """
    facts = facts or {}
    if kind == "gpu":
        return tuple(PluginDevice(g.device_id, "gpu", g.pci_address, g.numa_node)
                     for g in topology.gpus)
    out: list[PluginDevice] = []
    for nic in topology.nics:
        if kind == "pf":
            if nic.default_route or (nic.netdev and nic.netdev in routed):
                continue
            if offered(pool, _facts(nic, nic.pci_address, None, nic.driver, facts)):
                out.append(PluginDevice(nic.pci_address, "pf", nic.pci_address, nic.numa_node))
            continue
        for vf in nic.vfs:
            # vfio-pci is checked by name too: a stale RDMA name must not make it an RDMA VF.
            if (not vf.is_rdma or vf.driver == "vfio-pci"
                    or (vf.netdev and vf.netdev in routed) or vf.pool != pool_of(kind)):
                continue
            if offered(pool, _facts(nic, vf.pci_address, vf.vf_index, vf.driver, facts)):
                out.append(PluginDevice(vf.pci_address, kind, vf.pci_address, nic.numa_node,
                                        nic.pci_address))
    return tuple(out)


class PoolOverlap(ValueError):
    """A VF matched by the selectors of two pools: a VF is in one pool at most."""

    def __init__(self, vf: str, first: str, first_rule: int, second: str,
                 second_rule: int) -> None:
        super().__init__(f"VF {vf} is in two pools: selector {first_rule} of {first} and "
                         f"selector {second_rule} of {second} both match it (a VF may be "
                         "in one pool only)")
        self.vf, self.pools = vf, (first, second)


def assign_pools(topology: NodeTopology, pools: Sequence[tuple[str, tuple[Selector, ...]]],
                 default: str, facts: Mapping[str, DeviceFacts] | None = None) -> NodeTopology:
    """The topology with each VF's pool set from the pools' selectors: (resource name,
    selectors) in config order; `Vf.pool` is None for `default` (the default pool's name).
    Raises PoolOverlap naming both pools and their matching selectors (by index) for an
    RDMA VF two pools match. A VF no pool matches keeps None: the default pool's plugin does
    not offer it either, as its selectors do not match it (`offered_devices`)."""
    facts = facts or {}
    nics = []
    for nic in topology.nics:
        vfs = []
        for vf in nic.vfs:
            f = _facts(nic, vf.pci_address, vf.vf_index, vf.driver, facts)
            first: dict[str, int] = {}  # pool -> its first matching selector
            for name, selectors in pools:
                for i, sel in enumerate(selectors or (Selector(),)):
                    if name not in first and sel.matches(f):
                        first[name] = i
            if len(first) > 1 and vf.is_rdma:
                (a, ai), (b, bi) = list(first.items())[:2]
                raise PoolOverlap(vf.pci_address, a, ai, b, bi)
            name = next(iter(first), default)
            pool = None if name == default else name
            vfs.append(vf if vf.pool == pool else replace(vf, pool=pool))
        nics.append(replace(nic, vfs=tuple(vfs)))
    return replace(topology, nics=tuple(nics))


class SysfsProbe:
    """Reads selector facts, default routes and device health under a sysfs root."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(root)
        self.pci = os.path.join(self.root, "sys", "bus", "pci", "devices")

    def _read(self, path: str) -> str | None:
        # os.open/os.read, not open(): the health scan reads one small file per VF (1016 on a
        # dgx-h100 with 127 VFs per PF) every interval, and the io stack was most of its cost.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return os.read(fd, 4096).decode("utf-8", "replace").strip()
        except OSError:
            return None
        finally:
            os.close(fd)

    def _driver(self, pci: str) -> str | None:
        try:
            return os.path.basename(os.readlink(f"{self.pci}/{pci}/driver"))
        except OSError:
            return None

    def routed_netdevs(self) -> frozenset[str]:
        text = self._read(os.path.join(self.root, "proc", "net", "route"))
        return frozenset(parse_default_route_ifaces(text or ""))

    def facts(self, topology: NodeTopology) -> dict[str, DeviceFacts]:
        """Vendor, device and driver of every PF and VF, as selectors see them."""
        out: dict[str, DeviceFacts] = {}

        def hex_id(pci: str, name: str) -> str | None:
            v = self._read(f"{self.pci}/{pci}/{name}")
            return v.lower().removeprefix("0x") if v else None

        for nic in topology.nics:
            funcs = [(nic.pci_address, None)] + [(v.pci_address, v.vf_index) for v in nic.vfs]
            for pci, index in funcs:
                out[pci] = DeviceFacts(pci, hex_id(pci, "vendor"), hex_id(pci, "device"),
                                       self._driver(pci), nic.netdev, index, nic.link_layer)
        return out

    # ------------------------------------------------------------------ health

    def _port_problem(self, pci: str, rdma: str | None) -> str | None:
        """RDMA port 1 not ACTIVE; None when fine or when the device is not in our view."""
        if not rdma:
            return None
        state = self._read(f"{self.pci}/{pci}/infiniband/{rdma}/ports/1/state")
        if state is None:
            return None  # moved into a pod's namespace, or no port folder: nothing to judge
        name = parse_port_state(state)
        return None if name == "ACTIVE" else f"RDMA port {rdma}/1 is {name}"

    def _pf_problem(self, nic: Nic) -> str | None:
        if not os.path.exists(f"{self.pci}/{nic.pci_address}"):
            return f"PF {nic.pci_address} is gone"
        if nic.netdev:
            oper = self._read(f"{self.pci}/{nic.pci_address}/net/{nic.netdev}/operstate")
            if oper in ("down", "lowerlayerdown", "notpresent"):
                return f"PF {nic.netdev} link is {oper}"
        return self._port_problem(nic.pci_address, nic.rdma_device)

    def unhealthy(self, topology: NodeTopology) -> dict[str, str]:
        """Device ID → why it is unhealthy, for every device with a problem now."""
        out = self.unhealthy_gpus(topology)
        for nic in topology.nics:
            out.update(self.unhealthy_nic(nic))
        return out

    def unhealthy_gpus(self, topology: NodeTopology) -> dict[str, str]:
        return {g.device_id: f"GPU {g.pci_address} is gone" for g in topology.gpus
                if not os.path.exists(f"{self.pci}/{g.pci_address}")}

    def unhealthy_nic(self, nic: Nic) -> dict[str, str]:
        """One PF and its VFs (a slice of the scan small enough to run on the event loop)."""
        out: dict[str, str] = {}
        pf = self._pf_problem(nic)
        if pf:
            out[nic.pci_address] = pf
        for vf in nic.vfs:
            # One read answers the common case: the port state exists, so the VF does.
            state = None
            if vf.rdma_device:
                state = self._read(f"{self.pci}/{vf.pci_address}/infiniband/"
                                   f"{vf.rdma_device}/ports/1/state")
            if state is None and not os.path.exists(f"{self.pci}/{vf.pci_address}"):
                out[vf.pci_address] = f"VF {vf.pci_address} is gone"
            elif pf:
                out[vf.pci_address] = pf
            elif state is not None and parse_port_state(state) != "ACTIVE":
                out[vf.pci_address] = (f"RDMA port {vf.rdma_device}/1 is "
                                       f"{parse_port_state(state)}")
        return out
