"""The small sysfs/procfs text formats discovery reads, and the folder-path split."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from railyard.discovery.sysfs import (
    bdf_key,
    parent_pcie_parts,
    parse_default_route_ifaces,
    parse_meminfo_total_bytes,
    parse_nvidia_uuid,
    parse_port_state,
)

ROUTE_HEADER = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"
ifnames = st.from_regex(r"[a-z][a-z0-9]{0,14}", fullmatch=True)
hex32 = st.integers(0, 2**32 - 1).map(lambda v: f"{v:08X}")


@given(st.lists(st.tuples(ifnames, hex32, hex32), max_size=12))
def test_default_route_ifaces_are_those_with_zero_destination_and_mask(routes) -> None:
    lines = [ROUTE_HEADER] + [
        f"{i}\t{d}\t0100000A\t0003\t0\t0\t0\t{m}\t0\t0\t0" for i, d, m in routes
    ]
    expected = []
    for i, d, m in routes:
        if d == "00000000" and m == "00000000" and i not in expected:
            expected.append(i)
    assert parse_default_route_ifaces("\n".join(lines)) == expected


def test_route_table_without_default_has_no_default_iface() -> None:
    assert parse_default_route_ifaces(ROUTE_HEADER + "\n") == []
    assert parse_default_route_ifaces("") == []


@given(st.integers(0, 2**40), st.integers(0, 64))
def test_meminfo_total_is_read_in_bytes(kib: int, node: int) -> None:
    text = f"Node {node} MemTotal:   {kib} kB\nNode {node} MemFree:   1 kB\n"
    assert parse_meminfo_total_bytes(text) == kib * 1024


def test_meminfo_without_total_is_none() -> None:
    assert parse_meminfo_total_bytes("Node 0 MemFree: 5 kB\n") is None
    assert parse_meminfo_total_bytes("garbage") is None


def test_nvidia_information_gives_the_uuid() -> None:
    text = "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-1234-abcd\nDevice Minor: \t 0\n"
    assert parse_nvidia_uuid(text) == "GPU-1234-abcd"
    assert parse_nvidia_uuid("Model: x\n") is None


@given(st.integers(0, 9), st.sampled_from(["ACTIVE", "DOWN", "INIT", "ARMED", "ACTIVE_DEFER"]))
def test_port_state_drops_the_number(n: int, name: str) -> None:
    assert parse_port_state(f"{n}: {name}") == name
    assert parse_port_state(name) == name


@given(st.lists(st.tuples(st.integers(0, 0x1FFFF), st.integers(0, 255), st.integers(0, 31),
                          st.integers(0, 7)), min_size=1, max_size=20))
def test_pci_addresses_sort_numerically_even_with_five_digit_domains(keys) -> None:
    addresses = [f"{d:04x}:{b:02x}:{v:02x}.{f:x}" for d, b, v, f in keys]
    assert [bdf_key(a) for a in sorted(addresses, key=bdf_key)] == sorted(keys)


def test_folder_path_splits_into_root_complex_and_bridges() -> None:
    devices = "/r/sys/devices"
    parent = f"{devices}/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0"
    assert parent_pcie_parts(devices, parent) == (
        "pci0000:15", ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0"])
    assert parent_pcie_parts(devices, f"{devices}/pci0000:15") == ("pci0000:15", [])


def test_hyperv_and_vmd_folders_take_the_deepest_root_complex() -> None:
    devices = "/sys/devices"
    hyperv = f"{devices}/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00/abc-def/pci5a2f:00"
    assert parent_pcie_parts(devices, hyperv) == ("pci5a2f:00", [])
    vmd = f"{devices}/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1d.0"
    assert parent_pcie_parts(devices, vmd) == ("pci10000:e0", ["10000:e0:1d.0"])


def test_folder_outside_sys_devices_is_not_a_pci_path() -> None:
    assert parent_pcie_parts("/sys/devices", "/elsewhere/pci0000:00") is None
    assert parent_pcie_parts("/sys/devices", "/sys/devices/virtual/net") is None
