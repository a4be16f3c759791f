"""Hardware profiles: real server shapes (DGX and HGX systems, generic nodes) as data.

One spec per profile feeds two builders: `build_topology` (the model, in memory) and the
fake-sysfs writer in `railyard.discovery.fixture` (a tree discovery cannot tell from a real
machine). Discovering the written tree must give exactly `build_topology`'s answer.
Everything is deterministic: same profile, same addresses, names and UUIDs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from railyard.topology.model import (
    Gpu,
    Nic,
    NodeTopology,
    NumaNode,
    PciePath,
    Vf,
    distances_for,
)

GiB = 1 << 30
TiB = 1 << 40
DEFAULT_VFS_PER_PF = 8
MAX_VFS_PER_PF = 127

# A fixed namespace keeps fake GPU UUIDs stable across runs and machines.
_UUID_NAMESPACE = uuid.UUID("6f1c4a52-0d0e-4a53-9a7c-7261696c7961")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    bus: int
    vendor: str = "0x10de"
    device: str = "0x2330"
    pci_class: str = "0x030200"
    driver: str = "nvidia"
    has_uuid: bool = True  # NVIDIA exposes one in /proc/driver/nvidia; AMD here does not


@dataclass(frozen=True, slots=True)
class NicSpec:
    """A network PCI function. RDMA-capable unless `rdma_device` is None (a plain NIC)."""

    bus: int
    netdev: str
    rdma_device: str | None
    function: int = 0
    vendor: str = "0x15b3"
    device: str = "0x1021"
    vf_device: str = "0x101e"
    pci_class: str = "0x020700"
    driver: str = "mlx5_core"
    link_layer: str | None = "InfiniBand"  # None: not an RDMA port (a management NIC)
    rate: str | None = "400 Gb/sec (4X NDR)"
    compute: bool = False  # compute NICs get VFs; storage and management NICs do not
    total_vfs: int = MAX_VFS_PER_PF
    default_route: bool = False
    # The VPD `V3` keyword (one per card, shared by its PFs and its Data Direct function);
    # None: the fixture writes no `vpd` file.
    vpd_v3: str | None = None


@dataclass(frozen=True, slots=True)
class DataDirectSpec:
    """A NIC's Data Direct function (ConnectX-8, 15b3:2100): the card's DMA engine as a PCI
    function of its own, placed beside a GPU; `vpd_v3` names the card (its PFs' `vpd_v3`)."""

    bus: int
    vpd_v3: str
    vendor: str = "0x15b3"
    device: str = "0x2100"
    # Not relied on by discovery (it matches vendor:device); a DMA function reports no
    # network class of its own in what we could read, so the fixture says "other".
    pci_class: str = "0x088000"
    driver: str = "mlx5_ib"  # the kernel's data_direct.c is part of mlx5_ib


@dataclass(frozen=True, slots=True)
class SwitchSpec:
    """A PCIe switch: upstream port on `bus`, downstream ports on `bus + 1`."""

    bus: int
    children: tuple[GpuSpec | NicSpec | DataDirectSpec | SwitchSpec, ...]
    vendor: str = "0x1000"
    device: str = "0xc030"


# What sits below a root port or a switch port.
Child = GpuSpec | NicSpec | DataDirectSpec | SwitchSpec
_S = TypeVar("_S", GpuSpec, NicSpec, DataDirectSpec)


@dataclass(frozen=True, slots=True)
class RootSpec:
    """A root complex `pci<domain>:<bus>`; each child hangs off its own root port."""

    bus: int
    numa: int
    children: tuple[GpuSpec | NicSpec | DataDirectSpec | SwitchSpec, ...]
    domain: int = 0


@dataclass(frozen=True, slots=True)
class NumaSpec:
    cpus: str
    memory_bytes: int


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    name: str
    hostname: str
    numa: tuple[NumaSpec, ...]
    roots: tuple[RootSpec, ...]
    description: str = ""


@dataclass(frozen=True, slots=True)
class PlacedFunction:
    """A PCI function with its address and PCIe path, as the writer and the model see it."""

    address: str
    path: PciePath
    numa: int
    spec: GpuSpec | NicSpec | DataDirectSpec


@dataclass(frozen=True, slots=True)
class PlacedBridge:
    address: str
    parent_path: PciePath  # the path *to* this bridge (its ancestors)
    kind: str  # "root-port" | "switch-upstream" | "switch-downstream"
    vendor: str
    device: str
    numa: int


@dataclass(slots=True)
class Layout:
    """A profile laid out as PCI addresses: what both builders walk."""

    spec: ProfileSpec
    functions: list[PlacedFunction] = field(default_factory=list)
    bridges: list[PlacedBridge] = field(default_factory=list)


def bdf(domain: int, bus: int, dev: int, fn: int) -> str:
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def vf_address(pf_address: str, vf_index: int) -> str:
    """SR-IOV routing IDs: VF n sits at the PF's routing ID + 1 + n (offset 1, stride 1)."""
    domain, bus, devfn = pf_address.split(":")
    dev, fn = devfn.split(".")
    rid = (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn, 16)
    rid += 1 + vf_index
    return bdf(int(domain, 16), rid >> 8, (rid >> 3) & 0x1F, rid & 0x7)


def layout(spec: ProfileSpec) -> Layout:
    out = Layout(spec)
    for root in spec.roots:
        rc = f"pci{root.domain:04x}:{root.bus:02x}"
        for port_dev, group in enumerate(_by_bus(root.children), start=1):
            port = bdf(root.domain, root.bus, port_dev, 0)
            out.bridges.append(
                PlacedBridge(port, PciePath(rc, ()), "root-port", "0x8086", "0x352a", root.numa)
            )
            for child in group:
                _place(out, root, PciePath(rc, (port,)), child)
    return out


def _by_bus(children: Iterable[Child]) -> list[list[Child]]:
    """Functions of one device (a dual-port NIC) share the bus, so they share a port."""
    by_bus: dict[int, list[Child]] = {}
    for c in children:
        by_bus.setdefault(c.bus, []).append(c)
    return [group for _, group in sorted(by_bus.items())]


def _place(out: Layout, root: RootSpec, path: PciePath, child: Child) -> None:
    if isinstance(child, SwitchSpec):
        up = bdf(root.domain, child.bus, 0, 0)
        out.bridges.append(
            PlacedBridge(up, path, "switch-upstream", child.vendor, child.device, root.numa)
        )
        for dev, group in enumerate(_by_bus(child.children)):
            down = bdf(root.domain, child.bus + 1, dev, 0)
            up_path = PciePath(path.root_complex, (*path.bridges, up))
            out.bridges.append(
                PlacedBridge(down, up_path, "switch-downstream", child.vendor, child.device,
                             root.numa)
            )
            for c in group:
                _place(out, root, PciePath(path.root_complex, (*up_path.bridges, down)), c)
    else:
        fn = child.function if isinstance(child, NicSpec) else 0
        out.functions.append(PlacedFunction(bdf(root.domain, child.bus, 0, fn), path, root.numa,
                                            child))


def _specs(funcs: Iterable[PlacedFunction], kind: type[_S]) -> list[tuple[PlacedFunction, _S]]:
    """The functions whose spec is a `kind`, in their order, each with that spec."""
    return [(f, f.spec) for f in funcs if isinstance(f.spec, kind)]


def gpu_uuid(profile: str, address: str) -> str:
    return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{profile}/{address}"))


@dataclass(frozen=True, slots=True)
class RdmaNames:
    """RDMA device and verbs names for every RDMA function of a layout."""

    rdma: dict[str, str]  # pci address -> RDMA device
    uverbs: dict[str, str]  # pci address -> "uverbsN"
    vf_netdev: dict[str, str]  # VF pci address -> netdev


def vfs_of(placed: PlacedFunction, vfs_per_pf: int) -> list[str]:
    spec = placed.spec
    if not isinstance(spec, NicSpec) or not spec.compute or spec.rdma_device is None:
        return []
    return [vf_address(placed.address, i) for i in range(min(vfs_per_pf, spec.total_vfs))]


def rdma_names(lay: Layout, vfs_per_pf: int) -> RdmaNames:
    """Name VFs' RDMA devices after the PFs' (mlx5_N continues the PF numbering)."""
    nics = [(f, s) for f, s in _specs(lay.functions, NicSpec) if s.rdma_device]
    rdma = {f.address: s.rdma_device for f, s in nics if s.rdma_device}
    next_mlx = 1 + max(
        (int(n.split("_")[1]) for n in rdma.values() if n.startswith("mlx5_")
         and n.split("_")[1].isdigit()),
        default=-1,
    )
    vf_netdev: dict[str, str] = {}
    for f, s in sorted(nics, key=lambda fs: fs[0].address):
        for i, vf in enumerate(vfs_of(f, vfs_per_pf)):
            pf_rdma = rdma[f.address]
            if pf_rdma.startswith("mlx5_"):
                rdma[vf] = f"mlx5_{next_mlx}"
                next_mlx += 1
            else:
                rdma[vf] = f"{pf_rdma}v{i}"
            vf_netdev[vf] = f"{s.netdev}v{i}"
    # The kernel numbers verbs devices in registration order; PFs probe first, then VFs.
    order = sorted(rdma, key=lambda a: (a in vf_netdev, a))
    uverbs = {a: f"uverbs{i}" for i, a in enumerate(order)}
    return RdmaNames(rdma, uverbs, vf_netdev)


def build_topology(spec: ProfileSpec, vfs_per_pf: int = DEFAULT_VFS_PER_PF,
                   node: str | None = None, rails: bool = True) -> NodeTopology:
    """The topology discovery would report for this profile's fake sysfs tree, with the
    compute NICs' rails (`rails`; discovery alone cannot see cabling and reports none)."""
    if not 0 <= vfs_per_pf <= MAX_VFS_PER_PF:
        raise ValueError(f"vfs per PF must be 0..{MAX_VFS_PER_PF}, got {vfs_per_pf}")
    lay = layout(spec)
    names = rdma_names(lay, vfs_per_pf)
    gpu_funcs = sorted((f for f in lay.functions if isinstance(f.spec, GpuSpec)),
                       key=lambda f: f.address)
    nic_funcs = sorted((f for f in lay.functions
                        if isinstance(f.spec, NicSpec) and f.spec.rdma_device),
                       key=lambda f: f.address)
    gpus = tuple(
        Gpu(
            index=i,
            pci_address=f.address,
            numa_node=f.numa,
            uuid=gpu_uuid(spec.name, f.address) if g.has_uuid else None,
            vendor=g.vendor,
            device=g.device,
            pcie_root=f.path.root_complex,
            switch=f.path.nearest_switch,
        )
        for i, (f, g) in enumerate(_specs(gpu_funcs, GpuSpec))
    )
    via = data_direct_of(lay)
    # Rail-optimised fabrics cable compute NIC i (PCI order) to rail i, the NIC under GPU i
    # on these servers; storage NICs carry no rail (docs/rails.md).
    rail_at = {f.address: r for r, (f, _) in enumerate(
        (f, s) for f, s in _specs(nic_funcs, NicSpec) if s.compute)} if rails else {}
    nics = []
    for f, s in _specs(nic_funcs, NicSpec):
        vfs = tuple(
            Vf(pci_address=a, vf_index=i, rdma_device=names.rdma[a], netdev=names.vf_netdev[a],
               driver=s.driver, uverbs=names.uverbs[a])
            for i, a in enumerate(vfs_of(f, vfs_per_pf))
        )
        nics.append(Nic(
            pci_address=f.address, rdma_device=s.rdma_device, netdev=s.netdev, numa_node=f.numa,
            link_layer=s.link_layer, port_state="ACTIVE", rate=s.rate, driver=s.driver,
            pcie_root=f.path.root_complex, switch=f.path.nearest_switch,
            total_vfs=s.total_vfs if s.compute else 0, vfs=vfs,
            uverbs=names.uverbs[f.address], default_route=s.default_route,
            data_direct=via[f.address].address if f.address in via else None,
            rail=rail_at.get(f.address),
        ))
    distance = distances_for(
        {f.address: (f.path, f.numa) for f in gpu_funcs},
        {f.address: (f.path, f.numa) for f in nic_funcs},
        {n: (d.path, d.numa) for n, d in via.items()},
    )
    numa = tuple(NumaNode(i, n.cpus, n.memory_bytes) for i, n in enumerate(spec.numa))
    return NodeTopology(node or spec.hostname, numa, gpus, tuple(nics), distance)


def data_direct_of(lay: Layout) -> dict[str, PlacedFunction]:
    """RDMA PF address → the Data Direct function with the same VPD `V3` (discovery's rule)."""
    dd = {s.vpd_v3: f for f, s in _specs(lay.functions, DataDirectSpec)}
    return {f.address: dd[s.vpd_v3] for f, s in _specs(lay.functions, NicSpec)
            if s.rdma_device and s.vpd_v3 is not None and s.vpd_v3 in dd}


def device_paths(spec: ProfileSpec) -> dict[str, tuple[PciePath, int | None]]:
    """Each GPU's and RDMA PF's PCIe path and NUMA node: what `build_topology` measures its
    distances from (with the Data Direct functions' paths), and what discovery reports for the
    profile's fake tree (`Discovery.paths`)."""
    return {f.address: (f.path, f.numa) for f in layout(spec).functions
            if isinstance(f.spec, GpuSpec)
            or (isinstance(f.spec, NicSpec) and f.spec.rdma_device)}


# --------------------------------------------------------------------------- profiles


def _mgmt(bus: int) -> NicSpec:
    """The onboard Ethernet port that carries the default route: not an RDMA NIC."""
    return NicSpec(bus=bus, netdev="eno1", rdma_device=None, vendor="0x8086", device="0x1563",
                   pci_class="0x020000", driver="ixgbe", link_layer=None, rate=None,
                   total_vfs=0, default_route=True)


def _h100_group(root: int, gpu_bus: int, nic_bus: int, rdma: str, netdev: str,
                numa: int, storage: tuple[NicSpec, ...] = (), with_nic: bool = True,
                gpu_device: str = "0x2330") -> RootSpec:
    nic = (NicSpec(bus=nic_bus, netdev=netdev, rdma_device=rdma, compute=True),) if with_nic else ()
    return RootSpec(root, numa, (
        SwitchSpec(root + 1, (*nic, *storage, GpuSpec(gpu_bus, device=gpu_device))),
    ))


def _storage(bus: int, first: str, netdev: str) -> tuple[NicSpec, NicSpec]:
    n = int(first.split("_")[1])

    def port(f: int) -> NicSpec:
        return NicSpec(bus=bus, function=f, netdev=f"{netdev}f{f}np{f}",
                       rdma_device=f"mlx5_{n + f}", pci_class="0x020000",
                       link_layer="Ethernet", rate="200 Gb/sec (2X NDR)")

    return port(0), port(1)


_H100_NUMA = (NumaSpec("0-55,112-167", TiB), NumaSpec("56-111,168-223", TiB))

DGX_H100 = ProfileSpec(
    name="dgx-h100",
    hostname="dgx-h100",
    description="NVIDIA DGX H100: 8 H100 SXM5, 8 ConnectX-7 400G, one per GPU switch (PIX)",
    numa=_H100_NUMA,
    roots=(
        RootSpec(0x00, 0, (_mgmt(0x02),)),
        _h100_group(0x15, 0x1B, 0x18, "mlx5_0", "ibp24s0", 0,
                    storage=_storage(0x19, "mlx5_1", "enp25s0")),
        _h100_group(0x3D, 0x43, 0x40, "mlx5_3", "ibp64s0", 0),
        _h100_group(0x4C, 0x52, 0x4F, "mlx5_4", "ibp79s0", 0),
        _h100_group(0x5B, 0x61, 0x5E, "mlx5_5", "ibp94s0", 0),
        _h100_group(0x97, 0x9D, 0x9A, "mlx5_6", "ibp154s0", 1,
                    storage=_storage(0x9B, "mlx5_7", "enp155s0")),
        _h100_group(0xBD, 0xC3, 0xC0, "mlx5_9", "ibp192s0", 1),
        _h100_group(0xCB, 0xD1, 0xCE, "mlx5_10", "ibp206s0", 1),
        _h100_group(0xD9, 0xDF, 0xDC, "mlx5_11", "ibp220s0", 1),
    ),
)


def _a100_group(root: int, numa: int, gpus: tuple[int, int], nics: tuple[int, int],
                rdma: tuple[str, str]) -> RootSpec:
    """Two switch levels: a top switch over a GPU switch and a NIC switch (GPU↔NIC = PXB)."""
    gen4 = "0xc010"
    nic_specs = tuple(
        NicSpec(bus=b, netdev=f"ibp{b}s0", rdma_device=r, device="0x101b", vf_device="0x101c",
                rate="200 Gb/sec (4X HDR)", compute=True)
        for b, r in zip(nics, rdma, strict=True)
    )
    return RootSpec(root, numa, (
        SwitchSpec(root + 1, (
            SwitchSpec(root + 3, tuple(GpuSpec(b, device="0x20b2") for b in gpus), device=gen4),
            SwitchSpec(root + 8, nic_specs, device=gen4),
        ), device=gen4),
    ))


def _a100_numa() -> tuple[NumaSpec, ...]:
    # 2 × EPYC 7742 in NPS4: 16 cores (32 threads) per NUMA node, SMT siblings at +128.
    return tuple(
        NumaSpec(f"{n * 16}-{n * 16 + 15},{128 + n * 16}-{128 + n * 16 + 15}", 128 * GiB)
        for n in range(8)
    )


def _a100_storage(root: int, bus: int, numa: int, first: str) -> RootSpec:
    n = int(first.split("_")[1])
    return RootSpec(root, numa, tuple(
        NicSpec(bus=bus, function=f, netdev=f"enp{bus}s0f{f}", rdma_device=f"mlx5_{n + f}",
                device="0x101b", pci_class="0x020000", link_layer="Ethernet",
                rate="200 Gb/sec (4X HDR)")
        for f in (0, 1)
    ))


DGX_A100 = ProfileSpec(
    name="dgx-a100",
    hostname="dgx-a100",
    description="NVIDIA DGX A100: 8 A100 SXM4, 8 ConnectX-6 200G, 4 two-level switch groups",
    numa=_a100_numa(),
    roots=(
        RootSpec(0x20, 0, (_mgmt(0x22),)),
        _a100_group(0x01, 3, (0x07, 0x0F), (0x0C, 0x12), ("mlx5_0", "mlx5_1")),
        _a100_group(0x40, 1, (0x47, 0x4E), (0x4B, 0x54), ("mlx5_2", "mlx5_3")),
        _a100_storage(0x60, 0x61, 0, "mlx5_4"),
        _a100_group(0x80, 7, (0x87, 0x90), (0x8D, 0x94), ("mlx5_6", "mlx5_7")),
        _a100_group(0xB0, 5, (0xB7, 0xBD), (0xBA, 0xCC), ("mlx5_8", "mlx5_9")),
        _a100_storage(0xE0, 0xE1, 4, "mlx5_10"),
    ),
)


def _roce(bus: int, rdma: str) -> NicSpec:
    return NicSpec(bus=bus, netdev=f"enp{bus}s0np0", rdma_device=rdma, pci_class="0x020000",
                   link_layer="Ethernet", rate="400 Gb/sec (4X NDR)", compute=True)


def _hgx_group(root: int, numa: int, gpu_bus: int, nic: NicSpec | None) -> RootSpec:
    return RootSpec(root, numa, (
        SwitchSpec(root + 1, (*((nic,) if nic else ()), GpuSpec(gpu_bus))),
    ))


HGX_H100_4NIC = ProfileSpec(
    name="hgx-h100-4nic",
    hostname="hgx-h100-4nic",
    description="HGX H100 with 4 RoCE ConnectX-7: NICs only under the switches of GPU 0, 2, 4, 6",
    numa=(NumaSpec("0-47,96-143", TiB), NumaSpec("48-95,144-191", TiB)),
    roots=(
        RootSpec(0x00, 0, (_mgmt(0x02),)),
        _hgx_group(0x10, 0, 0x18, _roce(0x15, "mlx5_0")),
        _hgx_group(0x30, 0, 0x38, None),
        _hgx_group(0x50, 0, 0x58, _roce(0x55, "mlx5_1")),
        _hgx_group(0x70, 0, 0x78, None),
        _hgx_group(0x90, 1, 0x98, _roce(0x95, "mlx5_2")),
        _hgx_group(0xB0, 1, 0xB8, None),
        _hgx_group(0xD0, 1, 0xD8, _roce(0xD5, "mlx5_3")),
        _hgx_group(0xE8, 1, 0xEE, None),
    ),
)


def _mi300x_group(root: int, numa: int, i: int) -> RootSpec:
    nic_bus, gpu_bus = root + 3, root + 5
    return RootSpec(root, numa, (
        SwitchSpec(root + 1, (
            NicSpec(bus=nic_bus, netdev=f"ibp{nic_bus}s0", rdma_device=f"mlx5_{i}", compute=True),
            GpuSpec(gpu_bus, vendor="0x1002", device="0x74a1", pci_class="0x120000",
                    driver="amdgpu", has_uuid=False),
        )),
    ))


MI300X = ProfileSpec(
    name="mi300x",
    hostname="mi300x",
    description="8 × AMD MI300X with 8 ConnectX-7 400G, one GPU and one NIC per switch",
    numa=(NumaSpec("0-95,192-287", TiB), NumaSpec("96-191,288-383", TiB)),
    roots=(
        RootSpec(0x00, 0, (_mgmt(0x02),)),
        *(_mi300x_group(0x08 + 0x1C * i, i // 4, i) for i in range(8)),
    ),
)

# A CPU node for disaggregated serving (the DLRM trace's `CN` instances ask for CPUs, memory
# and a share of an RDMA NIC): one RoCE NIC per socket, no GPUs.
CPU_RDMA = ProfileSpec(
    name="cpu-rdma",
    hostname="cpu-rdma",
    description="CPU node: 2 × 64-core sockets (256 threads), 2 TiB, 2 ConnectX-7 400G RoCE, "
                "one per socket; no GPUs",
    numa=(NumaSpec("0-63,128-191", TiB), NumaSpec("64-127,192-255", TiB)),
    roots=(
        RootSpec(0x00, 0, (_mgmt(0x02),)),
        RootSpec(0x10, 0, (_roce(0x11, "mlx5_0"),)),
        RootSpec(0x90, 1, (_roce(0x91, "mlx5_1"),)),
    ),
)

GENERIC = ProfileSpec(
    name="generic",
    hostname="generic",
    description="1 socket, 2 GPUs, 2 RoCE NICs: GPU0+NIC0 under one switch, GPU1 and NIC1 on "
                "separate root ports of another root complex",
    numa=(NumaSpec("0-15", 64 * GiB),),
    roots=(
        RootSpec(0x00, 0, (_mgmt(0x02),)),
        RootSpec(0x10, 0, (
            SwitchSpec(0x11, (
                GpuSpec(0x14, device="0x26b9"),
                NicSpec(bus=0x13, netdev="enp19s0f0np0", rdma_device="mlx5_0", device="0x101d",
                        pci_class="0x020000", link_layer="Ethernet",
                        rate="100 Gb/sec (2X HDR)", compute=True),
            )),
        )),
        RootSpec(0x40, 0, (
            GpuSpec(0x41, device="0x26b9"),
            NicSpec(bus=0x42, netdev="enp66s0f0np0", rdma_device="mlx5_1", device="0x101d",
                    pci_class="0x020000", link_layer="Ethernet",
                    rate="100 Gb/sec (2X HDR)", compute=True),
        )),
    ),
)


# ConnectX-8's own PCIe switch (rdma_topo calls its ports `cx_switch`, 15b3:197c).
_CX8_SWITCH = {"vendor": "0x15b3", "device": "0x197c"}
_GRACE_NUMA = (NumaSpec("0-71", 480 * GiB), NumaSpec("72-143", 480 * GiB))


def _gb300_complex(i: int) -> tuple[RootSpec, RootSpec]:
    """GPU i with ConnectX-8 i, as rdma_topo expects a Data Direct complex: on one Grace root
    port, the card's switch holds the Data Direct function and, one switch further down, the
    GPU (GPU ↔ Data Direct: PXB); the card's PF hangs off a root port of another PCI segment
    of the same Grace (GPU ↔ PF alone: NODE)."""
    numa = i // 2
    v3 = str(uuid.uuid5(_UUID_NAMESPACE, f"gb300-dd/cx8-{i}")).replace("-", "")
    gpu_segment = RootSpec(0x00, numa, (
        SwitchSpec(0x01, (
            DataDirectSpec(0x03, vpd_v3=v3),
            SwitchSpec(0x04, (GpuSpec(0x06, device="0x31c2"),), **_CX8_SWITCH),
        ), **_CX8_SWITCH),
    ), domain=0x0008 + (i % 2) + 0x10 * numa)
    nic_segment = RootSpec(0x00, numa, (
        SwitchSpec(0x01, (
            NicSpec(bus=0x03, netdev=f"ibP{0x0001 + 2 * (i % 2) + 0x10 * numa:x}p3s0",
                    rdma_device=f"mlx5_{i}", device="0x1023", rate="800 Gb/sec (4X XDR)",
                    compute=True, vpd_v3=v3),
        ), **_CX8_SWITCH),
    ), domain=0x0001 + 2 * (i % 2) + 0x10 * numa)
    return gpu_segment, nic_segment


GB300_DD = ProfileSpec(
    name="gb300-dd",
    hostname="gb300-dd",
    description="GB300-like compute tray: 2 Grace, 4 GPUs, 4 ConnectX-8 800G whose PFs sit on "
                "other PCI segments than the GPUs; each reaches its GPU through a Data Direct "
                "function under the GPU's switch (PXB)",
    numa=_GRACE_NUMA,
    roots=(
        RootSpec(0x00, 0, (_mgmt(0x02),), domain=0x0004),
        *(segment for i in range(4) for segment in _gb300_complex(i)),
    ),
)


def _xe8640_port(root: int, numa: int, nic_bus: int, rdma: str) -> RootSpec:
    return RootSpec(root, numa, (_roce(nic_bus, rdma),))


# Dell PowerEdge XE8640-like: 4 × H100 SXM5 on CPU root ports, 4 × 400G RoCE NICs in PCIe
# slots. Only GPU 0 shares a PCIe switch with a NIC; the others reach theirs across root
# complexes (NODE) or sockets (SYS).
XE8640 = ProfileSpec(
    name="xe8640",
    hostname="xe8640",
    description="Dell XE8640-like: 4 H100 SXM5, 4 ConnectX-7 400G RoCE; only GPU0 shares a "
                "PCIe switch with a NIC (PIX), the rest are NODE from the nearest NIC",
    numa=(NumaSpec("0-47,96-143", TiB), NumaSpec("48-95,144-191", TiB)),
    roots=(
        RootSpec(0x00, 0, (_mgmt(0x02),)),
        RootSpec(0x15, 0, (SwitchSpec(0x16, (_roce(0x18, "mlx5_0"), GpuSpec(0x19))),)),
        RootSpec(0x38, 0, (GpuSpec(0x39),)),
        _xe8640_port(0x4a, 0, 0x4b, "mlx5_1"),
        RootSpec(0x97, 1, (GpuSpec(0x98),)),
        _xe8640_port(0xa8, 1, 0xa9, "mlx5_2"),
        RootSpec(0xb8, 1, (GpuSpec(0xb9),)),
        _xe8640_port(0xc9, 1, 0xca, "mlx5_3"),
    ),
)

PROFILES: dict[str, ProfileSpec] = {
    p.name: p for p in (DGX_H100, DGX_A100, HGX_H100_4NIC, MI300X, CPU_RDMA, GENERIC, GB300_DD,
                        XE8640)
}


def profile(name: str) -> ProfileSpec:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown profile {name!r}: expected one of {', '.join(sorted(PROFILES))}"
        ) from None
