"""The one JSON codec of NodeTopology: `railyard discover --format json`, cluster files and the
NodeTopology CR all embed this document (shape in docs/topology.md).

Decoding validates once at the boundary and names the offending field through
`records.fields` (`nics[3].vfs[0].pciAddress: expected a string, got null`): the types, and
what the core relies on beyond them — cpulists parse (ids up to MAX_CPU), addresses are PCI
addresses, every GPU, PF and VF address and every NUMA id is listed once, the distance table
is complete. Unknown keys are ignored, so a newer writer's additions do not break an older
reader of the same version.
"""

from __future__ import annotations

from typing import Any

from railyard.records.fields import FieldError, Fields, kind_of
from railyard.topology.model import Distance, Gpu, Nic, NodeTopology, NumaNode, Vf
from railyard.topology.rails import MAX_RAIL

VERSION = 1


class TopologyFormatError(FieldError):
    """A topology document that does not have the documented shape: `path` names the field."""


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
    out: dict[str, Any] = {
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
        "vfs": [_vf_to_json(v) for v in n.vfs],
    }
    if n.data_direct is not None:  # absent: no Data Direct function, as before (decision 0086)
        out["dataDirect"] = n.data_direct
    if n.rail is not None:  # absent: rail not known, as before rails (decision 0089)
        out["rail"] = n.rail
    return out


def _vf_to_json(v: Vf) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pciAddress": v.pci_address,
        "vfIndex": v.vf_index,
        "rdmaDevice": v.rdma_device,
        "netdev": v.netdev,
        "driver": v.driver,
        "uverbs": v.uverbs,
    }
    if v.pool is not None:  # absent: the default pool, as every document before pools says
        out["pool"] = v.pool
    return out


# ---------------------------------------------------------------------------- decode


def _obj(value: Any, where: str) -> Fields:
    return Fields(value, where, TopologyFormatError)


def topology_from_json(document: Any) -> NodeTopology:
    """Decode and validate a topology document; raises TopologyFormatError naming the field."""
    top = _obj(document, "")
    version = top.integer("version")
    if version != VERSION:
        top.fail("version", f"unsupported version {version}, expected {VERSION}")
    numa = tuple(
        NumaNode(id=o.integer("id"), cpus=o.cpulist("cpus"),
                 memory_bytes=o.integer("memoryBytes"))
        for o in top.objects("numaNodes")
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
        for o in top.objects("gpus")
    )
    nics = tuple(_nic_from_json(o) for o in top.objects("nics"))
    _unique_addresses(gpus, nics)
    distance = _distance_from_json(top, gpus, nics)
    return NodeTopology(node=top.string("node"), numa_nodes=numa, gpus=gpus, nics=nics,
                        distance=distance, version=version)


def _nic_from_json(o: Fields) -> Nic:
    vfs = tuple(
        Vf(
            pci_address=v.pci_address("pciAddress"),
            vf_index=v.integer("vfIndex"),
            rdma_device=v.string_or_null("rdmaDevice"),
            netdev=v.string_or_null("netdev"),
            driver=v.string_or_null("driver"),
            uverbs=v.string_or_null("uverbs"),
            pool=_pool(v),
        )
        for v in o.objects("vfs", optional=True)
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
        data_direct=o.pci_address("dataDirect") if o.get("dataDirect") is not None else None,
        rail=_rail(o),
    )


def _rail(o: Fields) -> int | None:
    """A NIC's rail: absent or null is unknown; else 0..MAX_RAIL."""
    if o.get("rail") is None:
        return None
    return o.integer("rail", 0, MAX_RAIL)


def _pool(v: Fields) -> str | None:
    """A VF's pool: absent or null is the default pool; else a resource name (domain/name)."""
    if "pool" not in v or v.get("pool") is None:
        return None
    name = v.string("pool")
    if name.count("/") != 1 or not all(name.partition("/")[::2]):
        v.fail("pool", f"expected a resource name (domain/name), got {name[:60]!r}")
    return name


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


def _distance_from_json(top: Fields, gpus: tuple[Gpu, ...],
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
        row = _obj(table.d[g.pci_address], where)
        for key in row.d:
            if key not in nic_set:
                raise TopologyFormatError(f'{where}["{key}"]', "not the address of a listed NIC")
        out[g.pci_address] = {}
        for nic in nic_addresses:
            at = f'{where}["{nic}"]'
            if nic not in row.d:
                raise TopologyFormatError(at, "missing")
            value = row.d[nic]
            if type(value) is not str:
                raise TopologyFormatError(at, f"expected a string, got {kind_of(value)}")
            try:
                out[g.pci_address][nic] = Distance.parse(value)
            except ValueError as exc:
                raise TopologyFormatError(at, str(exc)) from None
    return out
