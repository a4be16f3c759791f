"""The one JSON codec of NodeTopology: `railyard discover --format json`, cluster files and the
NodeTopology CR all embed this document (shape in docs/topology.md).

Decoding validates once at the boundary and names the offending field
(`nics[3].vfs[0].pciAddress: expected string`): the types, and what the core relies on beyond
them — cpulists parse (ids up to MAX_CPU), addresses are PCI addresses, every GPU, PF and VF
address and every NUMA id is listed once, the distance table is complete. Unknown keys are
ignored, so a newer writer's additions do not break an older reader of the same version.
"""

from __future__ import annotations

from typing import Any

from railyard.topology.cpus import parse_cpulist
from railyard.topology.model import PCI_ADDRESS_RE, Distance, Gpu, Nic, NodeTopology, NumaNode, Vf

VERSION = 1


class TopologyFormatError(ValueError):
    """A topology document that does not have the documented shape."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


# ---------------------------------------------------------------------------- encode


def topology_to_json(t: NodeTopology) -> dict[str, Any]:
    """The camelCase document of a topology; absent values are null."""
    return {
        "version": t.version,
        "node": t.node,
        "numaNodes": [
            {"id": n.id, "cpus": n.cpus, "memoryBytes": n.memory_bytes} for n in t.numa_nodes
        ],
        "gpus": [
            {
                "index": g.index,
                "pciAddress": g.pci_address,
                "numaNode": g.numa_node,
                "uuid": g.uuid,
                "vendor": g.vendor,
                "device": g.device,
                "pcieRoot": g.pcie_root,
                "switch": g.switch,
            }
            for g in t.gpus
        ],
        "nics": [_nic_to_json(n) for n in t.nics],
        "distance": {
            gpu: {nic: d.name for nic, d in row.items()} for gpu, row in t.distance.items()
        },
    }


def _nic_to_json(n: Nic) -> dict[str, Any]:
    return {
        "pciAddress": n.pci_address,
        "rdmaDevice": n.rdma_device,
        "netdev": n.netdev,
        "numaNode": n.numa_node,
        "linkLayer": n.link_layer,
        "portState": n.port_state,
        "rate": n.rate,
        "driver": n.driver,
        "pcieRoot": n.pcie_root,
        "switch": n.switch,
        "totalVfs": n.total_vfs,
        "uverbs": n.uverbs,
        "defaultRoute": n.default_route,
        "vfs": [
            {
                "pciAddress": v.pci_address,
                "vfIndex": v.vf_index,
                "rdmaDevice": v.rdma_device,
                "netdev": v.netdev,
                "driver": v.driver,
                "uverbs": v.uverbs,
            }
            for v in n.vfs
        ],
    }


# ---------------------------------------------------------------------------- decode


class _Obj:
    """A JSON object being decoded, with the path used in error messages."""

    __slots__ = ("d", "where")

    def __init__(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise TopologyFormatError(where, f"expected object, got {_kind(value)}")
        self.d = value
        self.where = where

    def _at(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _get(self, key: str, optional: bool) -> Any:
        if key not in self.d:
            if optional:
                return None
            raise TopologyFormatError(self._at(key), "missing")
        return self.d[key]

    def string(self, key: str) -> str:
        value = self._get(key, False)
        if not isinstance(value, str):
            raise TopologyFormatError(self._at(key), f"expected string, got {_kind(value)}")
        return value

    def pci_address(self, key: str) -> str:
        value = self.string(key)
        if not PCI_ADDRESS_RE.match(value):
            raise TopologyFormatError(self._at(key), "not a PCI address (dddd:bb:dd.f, domain "
                                                     f"of 4 to 8 hex digits): {value[:40]!r}")
        return value

    def cpulist(self, key: str) -> str:
        value = self.string(key)
        try:
            parse_cpulist(value)
        except ValueError as exc:
            raise TopologyFormatError(self._at(key), str(exc)) from None
        return value

    def string_or_null(self, key: str) -> str | None:
        value = self._get(key, True)
        if value is not None and not isinstance(value, str):
            raise TopologyFormatError(self._at(key),
                                      f"expected string or null, got {_kind(value)}")
        return value

    def integer(self, key: str, minimum: int = 0) -> int:
        value = self._get(key, False)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TopologyFormatError(self._at(key), f"expected integer, got {_kind(value)}")
        if value < minimum:
            raise TopologyFormatError(self._at(key), f"expected ≥ {minimum}, got {value}")
        return value

    def integer_or_null(self, key: str) -> int | None:
        if self._get(key, True) is None:
            return None
        return self.integer(key)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, True)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise TopologyFormatError(self._at(key), f"expected boolean, got {_kind(value)}")
        return value

    def object(self, key: str) -> _Obj:
        return _Obj(self._get(key, False), self._at(key))

    def array(self, key: str, optional: bool = False) -> list[tuple[Any, str]]:
        value = self._get(key, optional)
        if value is None and optional:
            return []
        if not isinstance(value, list):
            raise TopologyFormatError(self._at(key), f"expected array, got {_kind(value)}")
        return [(item, f"{self._at(key)}[{i}]") for i, item in enumerate(value)]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def topology_from_json(document: Any) -> NodeTopology:
    """Decode and validate a topology document; raises TopologyFormatError naming the field."""
    top = _Obj(document, "")
    version = top.integer("version")
    if version != VERSION:
        raise TopologyFormatError("version", f"unsupported version {version}, expected {VERSION}")
    numa = tuple(
        NumaNode(id=o.integer("id"), cpus=o.cpulist("cpus"),
                 memory_bytes=o.integer("memoryBytes"))
        for o in (_Obj(v, w) for v, w in top.array("numaNodes"))
    )
    for i, n in enumerate(numa):
        if any(m.id == n.id for m in numa[:i]):
            raise TopologyFormatError(f"numaNodes[{i}].id", f"duplicate NUMA node {n.id}")
    gpus = tuple(
        Gpu(
            index=o.integer("index"),
            pci_address=o.pci_address("pciAddress"),
            numa_node=o.integer_or_null("numaNode"),
            uuid=o.string_or_null("uuid"),
            vendor=o.string("vendor"),
            device=o.string("device"),
            pcie_root=o.string("pcieRoot"),
            switch=o.string_or_null("switch"),
        )
        for o in (_Obj(v, w) for v, w in top.array("gpus"))
    )
    nics = tuple(_nic_from_json(_Obj(v, w)) for v, w in top.array("nics"))
    _unique_addresses(gpus, nics)
    distance = _distance_from_json(top, gpus, nics)
    return NodeTopology(node=top.string("node"), numa_nodes=numa, gpus=gpus, nics=nics,
                        distance=distance, version=version)


def _nic_from_json(o: _Obj) -> Nic:
    vfs = tuple(
        Vf(
            pci_address=v.pci_address("pciAddress"),
            vf_index=v.integer("vfIndex"),
            rdma_device=v.string_or_null("rdmaDevice"),
            netdev=v.string_or_null("netdev"),
            driver=v.string_or_null("driver"),
            uverbs=v.string_or_null("uverbs"),
        )
        for v in (_Obj(item, w) for item, w in o.array("vfs", optional=True))
    )
    return Nic(
        pci_address=o.pci_address("pciAddress"),
        rdma_device=o.string_or_null("rdmaDevice"),
        netdev=o.string_or_null("netdev"),
        numa_node=o.integer_or_null("numaNode"),
        link_layer=o.string_or_null("linkLayer"),
        port_state=o.string_or_null("portState"),
        rate=o.string_or_null("rate"),
        driver=o.string_or_null("driver"),
        pcie_root=o.string("pcieRoot"),
        switch=o.string_or_null("switch"),
        total_vfs=o.integer("totalVfs"),
        vfs=vfs,
        uverbs=o.string_or_null("uverbs"),
        default_route=o.boolean("defaultRoute", False),
    )


def _unique_addresses(gpus: tuple[Gpu, ...], nics: tuple[Nic, ...]) -> None:
    """One PCI function is one device: a VF listed twice, or under a PF's or a GPU's address,
    would let the allocator grant one function twice or a PF as a VF."""
    named = [(g.pci_address, f"gpus[{i}].pciAddress") for i, g in enumerate(gpus)]
    named += [(n.pci_address, f"nics[{i}].pciAddress") for i, n in enumerate(nics)]
    named += [(v.pci_address, f"nics[{i}].vfs[{j}].pciAddress")
              for i, n in enumerate(nics) for j, v in enumerate(n.vfs)]
    seen: dict[str, str] = {}
    for address, field in named:
        if address in seen:
            raise TopologyFormatError(field, f"duplicate address {address} "
                                             f"(also {seen[address]})")
        seen[address] = field


def _distance_from_json(top: _Obj, gpus: tuple[Gpu, ...],
                        nics: tuple[Nic, ...]) -> dict[str, dict[str, Distance]]:
    """The full GPU × NIC table: the allocator looks up every pair, so none may be missing."""
    table = top.object("distance")
    nic_addresses = [n.pci_address for n in nics]
    nic_set = set(nic_addresses)
    gpu_addresses = {g.pci_address for g in gpus}
    out: dict[str, dict[str, Distance]] = {}
    for key in table.d:
        if key not in gpu_addresses:
            raise TopologyFormatError(f'distance["{key}"]', "not the address of a listed GPU")
    for g in gpus:
        where = f'distance["{g.pci_address}"]'
        if g.pci_address not in table.d:
            raise TopologyFormatError(where, "missing row for this GPU")
        row = _Obj(table.d[g.pci_address], where)
        for key in row.d:
            if key not in nic_set:
                raise TopologyFormatError(f'{where}["{key}"]', "not the address of a listed NIC")
        out[g.pci_address] = {}
        for nic in nic_addresses:
            at = f'{where}["{nic}"]'
            if nic not in row.d:
                raise TopologyFormatError(at, "missing")
            value = row.d[nic]
            if not isinstance(value, str):
                raise TopologyFormatError(at, f"expected string, got {_kind(value)}")
            try:
                out[g.pci_address][nic] = Distance.parse(value)
            except ValueError as exc:
                raise TopologyFormatError(at, str(exc)) from None
    return out
