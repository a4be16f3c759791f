"""Discovery: read a sysfs root (the folder holding `sys/` and `proc/`) into a NodeTopology.

Vendor-neutral by construction: a NIC is a network-class PCI function with an RDMA device
(or VFs with one), whatever the driver calls it; a GPU is a display or accelerator function of
NVIDIA or AMD. Devices are keyed by PCI address, never by netdev name, because a VF inside a
pod loses its netdev (and maybe its RDMA device) from the host view but keeps its address.
Anything unreadable becomes a warning naming the path; only a root that is not sysfs at all
raises `SysfsError`.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path

from railyard.discovery.sysfs import (
    BDF_RE,
    Sysfs,
    SysfsWarning,
    bdf_key,
    describe_error,
    parent_pcie_parts,
    parse_default_route_ifaces,
    parse_meminfo_total_bytes,
    parse_nvidia_uuid,
    parse_port_state,
    parse_vpd_keyword,
    read_attribute,
    routing_id,
    tree_root,
)
from railyard.topology.cpus import format_cpulist, parse_cpulist
from railyard.topology.model import (
    Gpu,
    Nic,
    NodeTopology,
    NumaNode,
    PciePath,
    Vf,
    distances_for,
)

GPU_VENDORS = frozenset({"0x10de", "0x1002"})  # NVIDIA, AMD
# A NIC's Data Direct function, by vendor:device (the kernel's mlx5_ib data_direct.c table and
# rdma-core's rdma_topo match it so): ConnectX-8's DMA engine exposed as a PCI function of its
# own, beside a GPU, while the PF sits elsewhere. Its class code is not relied on.
DATA_DIRECT_IDS = frozenset({("0x15b3", "0x2100")})
# The VPD-R keyword a Data Direct function shares with the PFs of its NIC (rdma_topo pairs
# them by it): the only link between the two that sysfs shows.
DATA_DIRECT_VPD_KEYWORD = "V3"
_BRIDGE_CLASS = 0x06  # base class of every bridge: never a Data Direct function
_GPU_CLASSES = frozenset({0x03, 0x12})  # display controller, processing accelerator
_NETWORK_CLASS = 0x02
# PCI-to-PCI bridge (0x0604) and semi-transparent PCI-to-PCI bridge (0x0609).
_BRIDGE_SUBCLASSES = frozenset({0x0604, 0x0609})
# Switchdev representors share their PF's `net/` folder; the uplink is the one to report.
_REPRESENTOR_RE = re.compile(r"(?:c[0-9]+)?pf[0-9]+(?:vf[0-9]+|sf[0-9]+)?", re.ASCII)
# Decimal numbers in entry names (node<N>, virtfn<N>, ports/<N>, uverbs<N>): ASCII only, as
# the kernel writes them; str.isdigit() would also pass "²", which int() refuses.
_DECIMAL_RE = re.compile(r"[0-9]+", re.ASCII)


def is_representor(phys_port_name: str) -> bool:
    """A switchdev representor's port name (`pf0vf3`, `c1pf0sf2`); an uplink's is `p0`."""
    return _REPRESENTOR_RE.fullmatch(phys_port_name) is not None


def _number_after(prefix: str, name: str) -> int | None:
    """N of `<prefix>N`; None for any other name."""
    if not name.startswith(prefix) or not _DECIMAL_RE.fullmatch(name, len(prefix)):
        return None
    return int(name[len(prefix):])


@dataclass(frozen=True, slots=True)
class Discovery:
    """A node's topology and what could not be read while discovering it."""

    topology: NodeTopology
    warnings: tuple[SysfsWarning, ...] = ()
    # Each GPU's and PF's PCIe path and the NUMA node its distances were measured with: the
    # topology keeps only GPU × NIC classes; `discover --format matrix` relates GPU to GPU
    # and NIC to NIC from these, by the same rule.
    paths: dict[str, tuple[PciePath, int | None]] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class _Function:
    address: str
    dir: str  # resolved device folder
    pci_class: int


def discover(root: str | os.PathLike[str] = Path("/")) -> Discovery:
    """Discover the node under `root` (the tree's root or its `sys`; `tree_root`). Raises
    SysfsError only when `root` is not a sysfs tree."""
    reader = _Reader(Sysfs(tree_root(root)))
    return reader.run()


class _Reader:
    """One discovery pass; holds the per-pass caches (class of each function, PCIe paths)."""

    def __init__(self, fs: Sysfs) -> None:
        self.fs = fs
        self.devices_dir = fs.path("sys", "devices")
        self.functions: dict[str, _Function] = {}
        self._paths: dict[str, PciePath | None] = {}
        self._numa_cpus: list[tuple[int, frozenset[int]]] = []
        self._pf_netdevs: dict[str, list[str]] = {}  # every netdev in each PF's net/ folder
        self._vf_addresses: set[str] = set()

    def run(self) -> Discovery:
        fs = self.fs
        numa_nodes = self._numa_nodes()
        self._numa_cpus = [(n.id, n.cpu_ids) for n in numa_nodes]
        self._pci_functions()
        gpu_rows = self._gpus()
        nic_rows = self._nics()
        via = self._data_direct([n for n, _, _ in nic_rows])
        routed = self._default_route_netdevs()
        nics = tuple(
            replace(_with_default_route(nic, self._pf_netdevs.get(nic.pci_address, []), routed),
                    data_direct=via[nic.pci_address][0] if nic.pci_address in via else None)
            for nic, _, _ in nic_rows
        )
        gpu_paths = {g.pci_address: (path, place) for g, path, place in gpu_rows}
        nic_paths = {n.pci_address: (path, place) for n, path, place in nic_rows}
        distance = distances_for(gpu_paths, nic_paths,
                                 {n: (path, place) for n, (_, path, place) in via.items()})
        topology = NodeTopology(
            node=self._hostname(),
            numa_nodes=numa_nodes,
            gpus=tuple(g for g, _, _ in gpu_rows),
            nics=nics,
            distance=distance,
        )
        return Discovery(topology, tuple(fs.warnings), {**gpu_paths, **nic_paths})

    # ----------------------------------------------------------------- NUMA and host facts

    def _numa_nodes(self) -> tuple[NumaNode, ...]:
        fs = self.fs
        node_dir = fs.path("sys", "devices", "system", "node")
        ids = sorted(
            i for i in (_number_after("node", name)
                        for name in fs.listdir(node_dir, optional=True))
            if i is not None
        )
        if not ids:
            fs.warn(node_dir, "no NUMA nodes listed; devices get no NUMA placement")
        nodes = []
        for i in ids:
            base = f"{node_dir}/node{i}"
            cpus = ""
            text = fs.read(f"{base}/cpulist")
            if text is not None:
                try:
                    cpus = format_cpulist(parse_cpulist(text))
                except ValueError as exc:
                    fs.warn(f"{base}/cpulist", str(exc))
            memory = 0
            meminfo = fs.read_text(f"{base}/meminfo")
            if meminfo is not None:
                total = parse_meminfo_total_bytes(meminfo)
                if total is None:
                    fs.warn(f"{base}/meminfo", "no 'MemTotal' line")
                else:
                    memory = total
            nodes.append(NumaNode(i, cpus, memory))
        return tuple(nodes)

    def _hostname(self) -> str:
        fs = self.fs
        path = fs.path("proc", "sys", "kernel", "hostname")
        if fs.root == os.sep:
            text = fs.read(path, optional=True)
            return text or socket.gethostname()
        text = fs.read(path)
        if not text:
            if text is not None:
                fs.warn(path, "empty host name")
            return "unknown"
        return text

    def _default_route_netdevs(self) -> frozenset[str]:
        """Netdevs carrying the IPv4 default route, and the devices below them (bond slaves,
        VLAN parents) through their `lower_*` links."""
        fs = self.fs
        text = fs.read_text(fs.path("proc", "net", "route"))
        if text is None:
            return frozenset()
        found: set[str] = set()
        todo = parse_default_route_ifaces(text)
        while todo:
            name = todo.pop()
            if name in found:
                continue
            found.add(name)
            for entry in fs.listdir(fs.path("sys", "class", "net", name), optional=True):
                if entry.startswith("lower_"):
                    todo.append(entry[len("lower_"):])
        return frozenset(found)

    # ------------------------------------------------------------------ PCI functions

    def _pci_functions(self) -> None:
        """Every function in sys/bus/pci/devices with its resolved folder and class."""
        fs = self.fs
        bus_dir = fs.path("sys", "bus", "pci", "devices")
        names = fs.listdir(bus_dir)
        found: list[_Function] = []
        for name in names:
            link = f"{bus_dir}/{name}"
            if not BDF_RE.fullmatch(name):
                fs.warn(link, "not a PCI address; skipped")
                continue
            try:
                target = os.readlink(link)
                folder = os.path.normpath(os.path.join(bus_dir, target))
            except OSError:
                folder = os.path.realpath(link)  # not a symlink: a tree laid out differently
                target = folder
            try:
                text = read_attribute(f"{folder}/class")
                pci_class = int(text, 16)
            except OSError as exc:
                if not os.path.isdir(folder):
                    fs.warn(link, f"dangling symlink to {target}; device skipped")
                else:
                    fs.warn(f"{folder}/class", describe_error(f"{folder}/class", exc)
                            + "; device skipped")
                continue
            except ValueError:
                fs.warn(f"{folder}/class", "not a hex class code; device skipped")
                continue
            found.append(_Function(name, folder, pci_class))
        found.sort(key=lambda f: bdf_key(f.address))
        self.functions = {f.address: f for f in found}

    def _pcie_path(self, folder: str) -> PciePath | None:
        """The function's root complex and bridges, from its folder's place in sys/devices.

        Cached per parent folder: a PF's 127 VFs share one parent.
        """
        parent = os.path.dirname(folder)
        if parent in self._paths:
            return self._paths[parent]
        parts = parent_pcie_parts(self.devices_dir, parent)
        path: PciePath | None = None
        if parts is None:
            self.fs.warn(folder, "not below a PCI root complex in sys/devices; skipped")
        else:
            root, ancestors = parts
            bridges = tuple(a for a in ancestors if self._is_bridge(a, parent))
            path = PciePath(root, bridges)
        self._paths[parent] = path
        return path

    def _is_bridge(self, address: str, parent: str) -> bool:
        """Count only PCI-to-PCI bridges: PciePath's switch alternation assumes nothing else."""
        f = self.functions.get(address)
        if f is not None:
            pci_class: int | None = f.pci_class
        else:
            folder = parent[: parent.index(address) + len(address)]
            pci_class = self.fs.read_int(f"{folder}/class", base=16)
        if pci_class is None:
            return True  # unreadable: it holds functions, so it almost surely is a bridge
        if (pci_class >> 8) in _BRIDGE_SUBCLASSES:
            return True
        folder = parent[: parent.index(address) + len(address)]
        self.fs.warn(folder, f"ancestor of class {pci_class:#08x} is not a PCI bridge; "
                              "left out of switch counting")
        return False

    def _placement(self, folder: str) -> tuple[int | None, int | None]:
        """(numa_node as sysfs says it, NUMA node used for distances).

        numa_node -1 means the firmware did not say: report None, never 0, but place the
        device by local_cpulist when those CPUs lie inside exactly one NUMA node.
        """
        fs = self.fs
        node = fs.read_int(f"{folder}/numa_node", optional=True)
        if node is not None and node >= 0:
            return node, node
        text = fs.read(f"{folder}/local_cpulist", optional=True)
        if not text:
            return None, None
        try:
            cpus = set(parse_cpulist(text))
        except ValueError as exc:
            fs.warn(f"{folder}/local_cpulist", str(exc))
            return None, None
        inside = [i for i, node_cpus in self._numa_cpus if cpus <= node_cpus]
        return None, (inside[0] if len(inside) == 1 else None)

    def _driver(self, folder: str) -> str | None:
        target = self.fs.readlink(f"{folder}/driver", optional=True)
        return os.path.basename(target) if target else None

    # -------------------------------------------------------------------------- GPUs

    def _gpus(self) -> list[tuple[Gpu, PciePath, int | None]]:
        fs = self.fs
        rows: list[tuple[Gpu, PciePath, int | None]] = []
        nvidia_without_uuid: list[int] = []
        for f in self.functions.values():
            if (f.pci_class >> 16) not in _GPU_CLASSES:
                continue
            vendor = fs.read(f"{f.dir}/vendor")
            if vendor is None or vendor.lower() not in GPU_VENDORS:
                continue
            if os.path.lexists(f"{f.dir}/physfn"):
                continue  # a GPU's own SR-IOV VF (MI300X 74b5) is not a separate GPU
            path = self._pcie_path(f.dir)
            if path is None:
                continue
            device = fs.read(f"{f.dir}/device") or ""
            numa, place = self._placement(f.dir)
            uuid = None
            if vendor.lower() == "0x10de":
                uuid = self._nvidia_uuid(f)
                if uuid is None:
                    nvidia_without_uuid.append(len(rows))
            gpu = Gpu(index=len(rows), pci_address=f.address, numa_node=numa, uuid=uuid,
                      vendor=vendor.lower(), device=device.lower(),
                      pcie_root=path.root_complex, switch=path.nearest_switch)
            rows.append((gpu, path, place))
        if nvidia_without_uuid and self.fs.root == os.sep:
            by_nvml = _nvml_uuids([rows[i][0].pci_address for i in nvidia_without_uuid])
            for i in nvidia_without_uuid:
                gpu, path, place = rows[i]
                if gpu.pci_address in by_nvml:
                    rows[i] = (replace(gpu, uuid=by_nvml[gpu.pci_address]), path, place)
        return rows

    def _nvidia_uuid(self, f: _Function) -> str | None:
        fs = self.fs
        info = fs.path("proc", "driver", "nvidia", "gpus", f.address, "information")
        # Only the nvidia driver publishes the file: a GPU bound to vfio-pci has none.
        bound_to_nvidia = self._driver(f.dir) == "nvidia"
        text = fs.read_text(info, optional=not bound_to_nvidia)
        if text is None:
            return None
        uuid = parse_nvidia_uuid(text)
        if uuid is None:
            fs.warn(info, "no 'GPU UUID' line")
        return uuid

    # -------------------------------------------------------------------------- NICs

    def _nics(self) -> list[tuple[Nic, PciePath, int | None]]:
        fs = self.fs
        # Full listings for PFs only: a thousand VFs cost one lstat each here, and their
        # subfolders are tried directly (a missing `net/` is normal: vfio-pci, or in a pod).
        entries: dict[str, set[str] | None] = {}
        pfs: list[_Function] = []
        vf_functions: dict[str, _Function] = {}
        for f in self.functions.values():
            if (f.pci_class >> 16) != _NETWORK_CLASS:
                continue
            if os.path.lexists(f"{f.dir}/physfn"):
                vf_functions[f.address] = f
                self._vf_addresses.add(f.address)
                entries[f.address] = None
                continue
            try:
                entries[f.address] = set(os.listdir(f.dir))
            except OSError as exc:
                fs.warn(f.dir, describe_error(f.dir, exc) + "; device skipped")
                continue
            pfs.append(f)

        # VFs of each PF, by its virtfn<N> links (the kernel's own numbering).
        vfs_of: dict[str, list[tuple[int, str, str]]] = {pf.address: [] for pf in pfs}
        claimed: dict[str, str] = {}  # VF address -> PF address
        for pf in pfs:
            links = sorted(
                (index, name) for name in entries[pf.address] or ()
                if (index := _number_after("virtfn", name)) is not None
            )
            for index, name in links:
                link = f"{pf.dir}/{name}"
                target = fs.readlink(link)
                if target is None:
                    continue
                folder = os.path.normpath(os.path.join(pf.dir, target))
                address = os.path.basename(folder)
                if address in claimed:
                    fs.warn(link, f"duplicate link to VF {address}, already listed by "
                                  f"PF {claimed[address]}; ignored")
                    continue
                if address not in entries:
                    if not os.path.isdir(folder):
                        fs.warn(link, f"dangling symlink to {target}; VF skipped")
                        continue
                    entries[address] = None
                claimed[address] = pf.address
                vfs_of[pf.address].append((index, address, folder))

        # VFs whose PF lost (or never had) the virtfn link: find them by their physfn link.
        pf_by_address = {pf.address: pf for pf in pfs}
        for address, f in vf_functions.items():
            if address in claimed:
                continue
            pf_folder = fs.resolve_link(f"{f.dir}/physfn")
            owner = pf_by_address.get(os.path.basename(pf_folder)) if pf_folder else None
            if owner is None:
                fs.warn(f"{f.dir}/physfn", "VF whose PF is not a listed network function; "
                                           "skipped")
                continue
            index = self._vf_index_from_routing_id(owner, address)
            fs.warn(owner.dir, f"no virtfn link to its VF {address}; VF index {index} derived "
                               "from sriov_offset/sriov_stride")
            claimed[address] = owner.address
            vfs_of[owner.address].append((index, address, f.dir))

        rows = []
        for pf in pfs:
            vfs = tuple(
                self._vf(address, folder, index, entries[address])
                for index, address, folder in sorted(vfs_of[pf.address])
            )
            row = self._nic(pf, entries[pf.address] or set(), vfs)
            if row is not None:
                rows.append(row)
        return rows

    def _vf_index_from_routing_id(self, pf: _Function, vf_address: str) -> int:
        """SR-IOV: VF n sits at routing ID = PF's + offset + n × stride (PCIe spec 9.3.3)."""
        offset = self.fs.read_int(f"{pf.dir}/sriov_offset", optional=True) or 1
        stride = self.fs.read_int(f"{pf.dir}/sriov_stride", optional=True) or 1
        return (routing_id(vf_address) - routing_id(pf.address) - offset) // stride

    def _vf(self, address: str, folder: str, index: int, names: set[str] | None) -> Vf:
        netdevs = self._listing(folder, "net", names)
        rdma = self._listing(folder, "infiniband", names)
        verbs = self._listing(folder, "infiniband_verbs", names)
        return Vf(
            pci_address=address,
            vf_index=index,
            rdma_device=rdma[0] if rdma else None,
            netdev=self._pick_netdev(folder, netdevs),
            driver=self._driver(folder) if names is None or "driver" in names else None,
            uverbs=self._pick_uverbs(folder, verbs, rdma[0] if rdma else None),
        )

    def _listing(self, folder: str, sub: str, names: set[str] | None) -> list[str]:
        """Entries of a subfolder; `names` (the folder's listing, when known) saves a call."""
        if names is not None and sub not in names:
            return []
        return sorted(self.fs.listdir(f"{folder}/{sub}", optional=True))

    def _pick_netdev(self, folder: str, netdevs: list[str]) -> str | None:
        if len(netdevs) <= 1:
            return netdevs[0] if netdevs else None
        uplinks = [
            n for n in netdevs
            if not is_representor(
                self.fs.read(f"{folder}/net/{n}/phys_port_name", optional=True) or "")
        ]
        return (uplinks or netdevs)[0]

    def _pick_uverbs(self, folder: str, verbs: list[str], rdma: str | None) -> str | None:
        verbs = sorted(verbs, key=lambda v: (_number_after("uverbs", v) is None,
                                             _number_after("uverbs", v) or 0, v))
        if len(verbs) <= 1 or rdma is None:
            return verbs[0] if verbs else None
        for v in verbs:
            if self.fs.read(f"{folder}/infiniband_verbs/{v}/ibdev", optional=True) == rdma:
                return v
        return verbs[0]

    def _nic(self, pf: _Function, names: set[str],
             vfs: tuple[Vf, ...]) -> tuple[Nic, PciePath, int | None] | None:
        fs = self.fs
        rdma = self._listing(pf.dir, "infiniband", names)
        rdma_device = rdma[0] if rdma else None
        if rdma_device is None and not any(v.rdma_device for v in vfs):
            return None  # plain Ethernet (or virtio): no RDMA, not a NIC for us
        path = self._pcie_path(pf.dir)
        if path is None:
            return None
        numa, place = self._placement(pf.dir)
        link_layer = port_state = rate = None
        if rdma_device is not None:
            link_layer, port_state, rate = self._port(f"{pf.dir}/infiniband/{rdma_device}")
        total_vfs = 0
        if "sriov_totalvfs" in names:
            total_vfs = fs.read_int(f"{pf.dir}/sriov_totalvfs") or 0
        if "sriov_numvfs" in names:
            numvfs = fs.read_int(f"{pf.dir}/sriov_numvfs")
            if numvfs is not None and numvfs != len(vfs):
                fs.warn(f"{pf.dir}/sriov_numvfs",
                        f"says {numvfs} VFs, found {len(vfs)} (virtfn links and physfn)")
        netdevs = self._listing(pf.dir, "net", names)
        self._pf_netdevs[pf.address] = netdevs
        nic = Nic(
            pci_address=pf.address,
            rdma_device=rdma_device,
            netdev=self._pick_netdev(pf.dir, netdevs),
            numa_node=numa,
            link_layer=link_layer,
            port_state=port_state,
            rate=rate,
            driver=self._driver(pf.dir) if "driver" in names else None,
            pcie_root=path.root_complex,
            switch=path.nearest_switch,
            total_vfs=total_vfs,
            vfs=vfs,
            uverbs=self._pick_uverbs(pf.dir, self._listing(pf.dir, "infiniband_verbs", names),
                                     rdma_device),
        )
        return nic, path, place

    # ------------------------------------------------------------------ Data Direct

    def _data_direct(self, nics: list[Nic]) -> dict[str, tuple[str, PciePath, int | None]]:
        """NIC (PF address) → (its Data Direct function, that function's path, NUMA node).

        A Data Direct function and the PFs of its NIC carry the same `V3` keyword in their VPD
        (`vpd`, readable by root only), as rdma-core's rdma_topo pairs them; nothing else in
        sysfs links them (the kernel pairs them by firmware query). Reading VPD is slow on
        some devices, so PFs are read only on a node that has a Data Direct function.
        """
        fs = self.fs
        found: list[_Function] = []
        for f in self.functions.values():
            if f.address in self._vf_addresses or (f.pci_class >> 16) == _BRIDGE_CLASS:
                continue
            vendor = fs.read(f"{f.dir}/vendor", optional=True)
            if vendor is None or vendor.lower() != "0x15b3":
                continue
            device = (fs.read(f"{f.dir}/device", optional=True) or "").lower()
            if (vendor.lower(), device) in DATA_DIRECT_IDS:
                found.append(f)
        if not found:
            return {}
        by_key: dict[str, _Function] = {}
        for f in found:
            key = self._vpd_keyword(f.dir)
            if key is None:
                fs.warn(f"{f.dir}/vpd", f"Data Direct function without a VPD "
                                        f"{DATA_DIRECT_VPD_KEYWORD} keyword: the NIC it serves "
                                        "is unknown; GPU distances leave it out")
            elif key in by_key:
                fs.warn(f"{f.dir}/vpd", f"Data Direct function with the same VPD "
                                        f"{DATA_DIRECT_VPD_KEYWORD} as {by_key[key].address}; "
                                        "left out")
            else:
                by_key[key] = f
        out: dict[str, tuple[str, PciePath, int | None]] = {}
        served: set[str] = set()
        for nic in nics:
            folder = self.functions[nic.pci_address].dir
            key = self._vpd_keyword(folder)
            dd = by_key.get(key) if key is not None else None
            if dd is None:
                continue
            path = self._pcie_path(dd.dir)
            if path is None:
                continue
            out[nic.pci_address] = (dd.address, path, self._placement(dd.dir)[1])
            served.add(dd.address)
        for f in by_key.values():
            if f.address not in served:
                fs.warn(f.dir, f"Data Direct function whose VPD {DATA_DIRECT_VPD_KEYWORD} "
                               "matches no RDMA PF: left out")
        return out

    def _vpd_keyword(self, folder: str) -> str | None:
        """The function's VPD keyword; absent VPD is normal, unreadable VPD (not root) warns."""
        data = self.fs.read_bytes(f"{folder}/vpd", optional=True)
        return parse_vpd_keyword(data, DATA_DIRECT_VPD_KEYWORD) if data is not None else None

    def _port(self, rdma_dir: str) -> tuple[str | None, str | None, str | None]:
        """Link layer, state and rate of the RDMA device's first port."""
        fs = self.fs
        ports = sorted(
            i for i in (_number_after("", p) for p in fs.listdir(f"{rdma_dir}/ports"))
            if i is not None
        )
        if not ports:
            return None, None, None
        base = f"{rdma_dir}/ports/{ports[0]}"
        state = fs.read(f"{base}/state")
        return (
            fs.read(f"{base}/link_layer"),
            parse_port_state(state) if state is not None else None,
            fs.read(f"{base}/rate"),
        )


def _with_default_route(nic: Nic, netdevs: list[str], routed: frozenset[str]) -> Nic:
    """Mark the PF when any netdev of its function carries the default route: not only the
    one reported as `netdev`, but IPoIB P_Key children (`ib0.8001`), which the kernel parents
    on the HCA's PCI function without a `lower_` link to `ib0`."""
    if routed.isdisjoint(netdevs):
        return nic
    return replace(nic, default_route=True)


def _nvml_uuids(addresses: list[str]) -> dict[str, str]:
    """GPU UUIDs from NVML when the optional `nvidia-ml-py` is installed and a driver runs."""
    try:
        import pynvml  # optional; untyped (pyproject's mypy overrides)
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError subclasses; no driver, no library
        return {}
    out: dict[str, str] = {}
    try:
        for address in addresses:
            try:
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(address)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
            except Exception:
                continue
            out[address] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return out
