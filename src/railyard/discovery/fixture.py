"""Fake sysfs trees: a hardware profile written as the files a real Linux host shows.

The tree follows the kernel's layout (real folders for devices, relative symlinks for
`sys/bus`, `sys/class`, `driver`, `physfn`, `virtfn<N>`…), so discovery reads it exactly as it
reads `/`, and tests can break it the way real machines break (a VF moved into a pod, a file
gone). Deterministic: one profile and VF count always give the same bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from railyard.discovery.profiles import (
    DEFAULT_VFS_PER_PF,
    MAX_VFS_PER_PF,
    DataDirectSpec,
    GpuSpec,
    NicSpec,
    PlacedFunction,
    ProfileSpec,
    gpu_uuid,
    layout,
    rdma_names,
    vfs_of,
)
from railyard.discovery.sysfs import bdf_key, routing_id
from railyard.topology.cpus import parse_cpulist

UVERBS_MAJOR, UVERBS_MINOR_BASE = 231, 192  # /dev/infiniband/uverbs<N> is 231:(192+N)
_ARPHRD_ETHER, _ARPHRD_INFINIBAND = 1, 32


class _Tree:
    """Writes files, folders and relative symlinks below one output folder.

    Remembers the folders it made: a 1,000-VF tree has 50,000 entries, and asking the file
    system again for each parent doubled the writing time.
    """

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self._made: set[str] = {self.root}

    def abs(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def made(self, rel: str) -> bool:
        return self.abs(rel) in self._made

    def mkdir(self, path: str) -> None:
        if path not in self._made:
            os.makedirs(path, exist_ok=True)
            self._made.add(path)

    def _write(self, path: str, text: str) -> None:
        data = (text if text.endswith("\n") or not text else text + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def binary(self, rel: str, data: bytes) -> None:
        path = self.abs(rel)
        self.mkdir(os.path.dirname(path))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # vpd: root only
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def file(self, rel: str, text: str) -> None:
        path = self.abs(rel)
        self.mkdir(os.path.dirname(path))
        self._write(path, text)

    def files(self, folder: str, values: dict[str, str]) -> None:
        base = self.abs(folder)
        self.mkdir(base)
        for name, text in values.items():
            self._write(f"{base}/{name}", text)

    def link(self, rel_link: str, rel_target: str) -> None:
        """A symlink relative to the link's own folder, as sysfs makes them."""
        link = self.abs(rel_link)
        parent = os.path.dirname(link)
        self.mkdir(parent)
        os.symlink(os.path.relpath(self.abs(rel_target), parent), link)


def write_fixture(spec: ProfileSpec, outdir: str | os.PathLike[str],
                  vfs_per_pf: int = DEFAULT_VFS_PER_PF, node: str | None = None) -> Path:
    """Write `spec` as a sysfs root (with `sys/` and `proc/`) into `outdir`; returns it.

    `outdir` may exist but must be empty. Discovering the result gives exactly
    `build_topology(spec, vfs_per_pf, node)`.
    """
    if not 0 <= vfs_per_pf <= MAX_VFS_PER_PF:
        raise ValueError(f"vfs per PF must be 0..{MAX_VFS_PER_PF}, got {vfs_per_pf}")
    out = Path(outdir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: exists and is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    _Writer(_Tree(out), spec, vfs_per_pf, node or spec.hostname).write()
    return out


class _Writer:
    def __init__(self, tree: _Tree, spec: ProfileSpec, vfs_per_pf: int, node: str) -> None:
        self.t = tree
        self.spec = spec
        self.vfs_per_pf = vfs_per_pf
        self.node = node
        self.lay = layout(spec)
        self.names = rdma_names(self.lay, vfs_per_pf)
        all_cpus = [c for n in spec.numa for c in parse_cpulist(n.cpus)]
        self.nr_cpus = max(all_cpus, default=0) + 1
        self.iommu_group = 0
        self.ifindex = 1  # lo
        self.netdevs: list[tuple[str, str]] = []  # (netdev, folder) written so far

    # ----------------------------------------------------------------------- top level

    def write(self) -> None:
        t = self.t
        self._numa()
        for bridge in self.lay.bridges:
            folder = self._folder(bridge.parent_path.root_complex,
                                  bridge.parent_path.bridges, bridge.address)
            self._pci_function(folder, bridge.address, bridge.vendor, bridge.device,
                               "0x060400", bridge.numa, "pcieport", iommu=False)
        for root in {f.path.root_complex for f in self.lay.functions} | {
            b.parent_path.root_complex for b in self.lay.bridges
        }:
            t.file(f"sys/devices/{root}/uevent", "")
        functions = sorted(self.lay.functions, key=lambda f: bdf_key(f.address))
        gpu_minor = 0
        for f in functions:
            if isinstance(f.spec, GpuSpec):
                self._gpu(f, f.spec, gpu_minor)
                gpu_minor += f.spec.vendor == "0x10de"
            elif isinstance(f.spec, DataDirectSpec):
                self._data_direct(f, f.spec)
            else:
                self._nic(f, f.spec)
        self._loopback()
        t.file("sys/class/infiniband_verbs/abi_version", "6")
        t.file("sys/bus/pci/drivers_autoprobe", "1")
        t.file("proc/sys/kernel/hostname", self.node)
        self._route()

    def _numa(self) -> None:
        n = len(self.spec.numa)
        base = "sys/devices/system/node"
        ids = f"0-{n - 1}" if n > 1 else "0"
        self.t.files(base, {"online": ids, "possible": ids, "has_cpu": ids, "has_memory": ids})
        for i, numa in enumerate(self.spec.numa):
            kib = numa.memory_bytes // 1024
            self.t.files(f"{base}/node{i}", {
                "cpulist": numa.cpus,
                "cpumap": self._mask(parse_cpulist(numa.cpus)),
                "meminfo": "\n".join([
                    f"Node {i} MemTotal:       {kib} kB",
                    f"Node {i} MemFree:        {kib * 15 // 16} kB",
                    f"Node {i} MemUsed:        {kib - kib * 15 // 16} kB",
                ]),
                # SLIT: 10 to itself; the usual firmware value elsewhere.
                "distance": " ".join("10" if j == i else "21" for j in range(n)),
            })
        self.t.file("sys/devices/system/cpu/online", f"0-{self.nr_cpus - 1}")

    def _route(self) -> None:
        header = ("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\t"
                  "Window\tIRTT")
        lines = [header]
        for f in sorted(self.lay.functions, key=lambda f: bdf_key(f.address)):
            if isinstance(f.spec, NicSpec) and f.spec.default_route:
                dev = f.spec.netdev
                lines.append(f"{dev}\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0")
                lines.append(f"{dev}\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0")
        self.t.file("proc/net/route", "\n".join(lines))

    def _loopback(self) -> None:
        folder = "sys/devices/virtual/net/lo"
        self.t.files(folder, {"address": "00:00:00:00:00:00", "mtu": "65536",
                              "operstate": "unknown", "carrier": "1", "ifindex": "1",
                              "type": "772"})
        self.t.link("sys/class/net/lo", folder)

    # ------------------------------------------------------------------- PCI functions

    @staticmethod
    def _folder(root_complex: str, bridges: tuple[str, ...], address: str) -> str:
        return "/".join(("sys/devices", root_complex, *bridges, address))

    def _mask(self, cpus: list[int]) -> str:
        """The kernel's hex cpumask: 32-bit words, most significant first, comma-separated."""
        words = max(1, (self.nr_cpus + 31) // 32)
        value = 0
        for c in cpus:
            value |= 1 << c
        return ",".join(f"{(value >> (32 * w)) & 0xFFFFFFFF:08x}" for w in reversed(range(words)))

    def _pci_function(self, folder: str, address: str, vendor: str, device: str,
                      pci_class: str, numa: int, driver: str | None, iommu: bool = True) -> None:
        t = self.t
        cpus = self.spec.numa[numa].cpus
        t.files(folder, {
            "vendor": vendor,
            "device": device,
            "class": pci_class,
            "subsystem_vendor": vendor,
            "subsystem_device": "0x0000",
            "revision": "0x00",
            "numa_node": str(numa),
            "local_cpulist": cpus,
            "local_cpus": self._mask(parse_cpulist(cpus)),
            "enable": "1",
            "uevent": "\n".join([
                *([f"DRIVER={driver}"] if driver else []),
                f"PCI_CLASS={pci_class[2:].upper()}",
                f"PCI_ID={vendor[2:].upper()}:{device[2:].upper()}",
                f"PCI_SLOT_NAME={address}",
            ]),
        })
        t.link(f"{folder}/subsystem", "sys/bus/pci")
        t.link(f"sys/bus/pci/devices/{address}", folder)
        if driver:
            self._bind(folder, address, driver)
        if iommu:
            group = f"sys/kernel/iommu_groups/{self.iommu_group}"
            self.iommu_group += 1
            t.link(f"{folder}/iommu_group", group)
            t.link(f"{group}/devices/{address}", folder)

    def _bind(self, folder: str, address: str, driver: str) -> None:
        drivers = f"sys/bus/pci/drivers/{driver}"
        if not self.t.made(drivers):
            self.t.files(drivers, {"bind": "", "unbind": "", "new_id": "", "remove_id": ""})
        self.t.link(f"{folder}/driver", drivers)
        self.t.link(f"{drivers}/{address}", folder)

    def _gpu(self, f: PlacedFunction, s: GpuSpec, minor: int) -> None:
        folder = self._folder(f.path.root_complex, f.path.bridges, f.address)
        self._pci_function(folder, f.address, s.vendor, s.device, s.pci_class, f.numa, s.driver)
        if s.vendor == "0x10de" and s.has_uuid:
            self.t.file(f"proc/driver/nvidia/gpus/{f.address}/information", "\n".join([
                "Model: \t\t NVIDIA GPU",
                "IRQ:   \t\t 0",
                f"GPU UUID: \t {gpu_uuid(self.spec.name, f.address)}",
                "Video BIOS: \t ??.??.??.??.??",
                "Bus Type: \t PCIe",
                "DMA Size: \t 52 bits",
                "DMA Mask: \t 0xfffffffffffff",
                f"Bus Location: \t {f.address}",
                f"Device Minor: \t {minor}",
                "GPU Excluded:\t No",
            ]))

    def _data_direct(self, f: PlacedFunction, s: DataDirectSpec) -> None:
        """A Data Direct function: a PCI function with VPD, no netdev and no RDMA device."""
        folder = self._folder(f.path.root_complex, f.path.bridges, f.address)
        self._pci_function(folder, f.address, s.vendor, s.device, s.pci_class, f.numa, s.driver)
        self.t.binary(f"{folder}/vpd", vpd_bytes("ConnectX-8 Data Direct", {"V3": s.vpd_v3}))

    # -------------------------------------------------------------------------- NICs

    def _nic(self, f: PlacedFunction, s: NicSpec) -> None:
        folder = self._folder(f.path.root_complex, f.path.bridges, f.address)
        self._pci_function(folder, f.address, s.vendor, s.device, s.pci_class, f.numa, s.driver)
        if s.vpd_v3 is not None:
            self.t.binary(f"{folder}/vpd", vpd_bytes("ConnectX-8 SuperNIC", {"V3": s.vpd_v3}))
        vfs = vfs_of(f, self.vfs_per_pf)
        if s.compute and s.total_vfs > 0:
            self.t.files(folder, {
                "sriov_totalvfs": str(s.total_vfs),
                "sriov_numvfs": str(len(vfs)),
                "sriov_offset": "1",  # profiles.vf_address: offset 1, stride 1
                "sriov_stride": "1",
                "sriov_vf_device": s.vf_device[2:],
                "sriov_drivers_autoprobe": "1",
            })
        self._netdev(folder, f.address, s.netdev, s.link_layer, physical=True)
        if s.rdma_device:
            self._rdma(folder, f.address, s.rdma_device, s)
        parent = os.path.dirname(folder)
        for i, vf in enumerate(vfs):
            vf_folder = f"{parent}/{vf}"
            self._pci_function(vf_folder, vf, s.vendor, s.vf_device, s.pci_class, f.numa,
                               s.driver)
            self.t.link(f"{folder}/virtfn{i}", vf_folder)
            self.t.link(f"{vf_folder}/physfn", folder)
            self._netdev(vf_folder, vf, self.names.vf_netdev[vf], s.link_layer, physical=False)
            self._rdma(vf_folder, vf, self.names.rdma[vf], s)

    def _netdev(self, folder: str, address: str, name: str, link_layer: str | None,
                physical: bool) -> None:
        self.ifindex += 1
        rid = (bdf_key(address)[0] << 16) | routing_id(address)
        infiniband = link_layer == "InfiniBand"
        if infiniband:  # IPoIB: 4 bytes QPN + flags, then the port GID
            address_text = "00:00:10:87:fe:80:00:00:00:00:00:00:" + _colons(_guid(rid))
        else:
            address_text = _colons(f"{0x02_00_00_00_00_00 | rid:012x}")
        values = {
            "address": address_text,
            "mtu": "4092" if infiniband else "1500",
            "operstate": "up",
            "carrier": "1",
            "ifindex": str(self.ifindex),
            "type": str(_ARPHRD_INFINIBAND if infiniband else _ARPHRD_ETHER),
        }
        if physical and not infiniband:
            values["phys_port_name"] = "p0"
        net = f"{folder}/net/{name}"
        self.t.files(net, values)
        self.t.link(f"{net}/device", folder)
        self.t.link(f"sys/class/net/{name}", net)

    def _rdma(self, folder: str, address: str, rdma: str, s: NicSpec) -> None:
        rid = (bdf_key(address)[0] << 16) | routing_id(address)
        ib = f"{folder}/infiniband/{rdma}"
        self.t.files(ib, {
            "node_guid": _guid(rid),
            "node_type": "1: CA",
            "fw_ver": "28.39.1002",
            "hca_type": "MT" + str(int(s.device, 16)),
        })
        self.t.link(f"{ib}/device", folder)
        self.t.files(f"{ib}/ports/1", {
            "state": "4: ACTIVE",
            "phys_state": "5: LinkUp",
            "link_layer": s.link_layer or "Ethernet",
            "rate": s.rate or "",
            "lid": "0x0",
        })
        self.t.link(f"sys/class/infiniband/{rdma}", ib)
        uverbs = self.names.uverbs[address]
        n = int(uverbs[len("uverbs"):])
        verbs = f"{folder}/infiniband_verbs/{uverbs}"
        self.t.files(verbs, {"ibdev": rdma, "abi_version": "1",
                             "dev": f"{UVERBS_MAJOR}:{UVERBS_MINOR_BASE + n}"})
        self.t.link(f"{verbs}/device", folder)
        self.t.link(f"sys/class/infiniband_verbs/{uverbs}", verbs)


def vpd_bytes(name: str, keywords: dict[str, str]) -> bytes:
    """PCI VPD as a function's `vpd` file holds it: the identifier string, a VPD-R section
    with `keywords` and the `RV` checksum keyword (all bytes so far sum to 0), the end tag."""
    ident = name.encode("ascii")
    out = bytearray([0x82, *len(ident).to_bytes(2, "little"), *ident])
    body = bytearray()
    for key, value in keywords.items():
        data = value.encode("ascii")
        body += key.encode("ascii") + bytes([len(data)]) + data
    body += b"RV\x01"  # one byte of checksum follows
    out += bytes([0x90, *(len(body) + 1).to_bytes(2, "little")]) + body
    out.append((-sum(out)) & 0xFF)
    out.append(0x78)
    return bytes(out)


def _guid(rid: int) -> str:
    """A stable EUI-64 node GUID per function, in sysfs's `xxxx:xxxx:xxxx:xxxx` form."""
    value = 0xA088C20300000000 | rid
    text = f"{value:016x}"
    return ":".join(text[i:i + 4] for i in range(0, 16, 4))


def _colons(hex_text: str) -> str:
    digits = hex_text.replace(":", "")
    return ":".join(digits[i:i + 2] for i in range(0, len(digits), 2))
