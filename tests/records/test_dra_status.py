"""The codec of our entries in a claim's status.devices (records.dra_status): KEP-4817's network
data per NIC, bounded and checked as kube-apiserver v1.36.3 checks it, only devices of the
claim's allocation, and an apply body that names our entries only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.records.dra_names import DRIVER, device_name
from railyard.records.dra_status import (
    FIELD_MANAGER,
    MAX_IPS,
    DeviceStatusError,
    NicNetwork,
    interface_address,
    network_status,
    status_apply,
)

POOL = "node-a"
VF0, VF1 = device_name("0000:18:00.2"), device_name("0000:2a:00.2")
ALLOCATED = frozenset({(DRIVER, POOL, VF0), (DRIVER, POOL, VF1),
                       (DRIVER, POOL, device_name("0000:19:00.0"))})  # a GPU of ours too


def nic(device: str = VF0, **kw) -> NicNetwork:
    return NicNetwork(**{"device": device, "pool": POOL, "interface_name": "net1",
                         "hardware_address": "02:00:00:00:00:01", "ips": ("10.56.0.2/16",),
                         **kw})


def test_each_nic_is_an_entry_of_our_driver_with_its_interface_mac_and_addresses():
    entries = network_status([nic(), nic(VF1, interface_name="net1-1",
                                         hardware_address="02:00:00:00:00:02",
                                         ips=("10.56.0.3/16", "fd00::3/64"))], ALLOCATED)
    assert entries == [
        {"driver": "railyard.dev", "pool": POOL, "device": VF0,
         "networkData": {"interfaceName": "net1", "ips": ["10.56.0.2/16"],
                         "hardwareAddress": "02:00:00:00:00:01"}},
        {"driver": "railyard.dev", "pool": POOL, "device": VF1,
         "networkData": {"interfaceName": "net1-1", "ips": ["10.56.0.3/16", "fd00::3/64"],
                         "hardwareAddress": "02:00:00:00:00:02"}}]


def test_a_nic_without_addresses_or_mac_says_only_what_is_known():
    [entry] = network_status([nic(ips=(), hardware_address=None)], ALLOCATED)
    assert entry["networkData"] == {"interfaceName": "net1"}


def test_a_device_not_in_the_claims_allocation_is_refused_by_name():
    other = device_name("0000:9a:00.2")
    with pytest.raises(DeviceStatusError, match=f"{other}: not a device of the claim's "
                                                "allocation"):
        network_status([nic(), nic(other)], ALLOCATED)
    with pytest.raises(DeviceStatusError, match="not a device"):  # right device, other pool
        network_status([nic(pool="node-b")], ALLOCATED)
    with pytest.raises(DeviceStatusError, match="not a device"):  # another driver's
        network_status([nic()], ALLOCATED, driver="gpu.nvidia.com")


def test_a_device_named_twice_is_refused():
    with pytest.raises(DeviceStatusError, match="named twice"):
        network_status([nic(), nic(interface_name="net2")], ALLOCATED)


@pytest.mark.parametrize(("change", "said"), [
    ({"interface_name": "x" * 257}, "interface name over 256 bytes"),
    ({"hardware_address": "a" * 129}, "hardware address over 128 bytes"),
    ({"ips": ("10.56.0.2",)}, "no prefix length"),
    ({"ips": ("10.56.0.2/33",)}, "10.56.0.2/33"),
    ({"ips": ("fe80::1%net1/64",)}, "zoned"),
    ({"ips": ("::ffff:10.0.0.1/64",)}, "IPv4-mapped"),
    ({"device": "PCI_0000"}, "not a DNS label"),
    ({"pool": "Node_A"}, "pool name"),
])
def test_what_the_api_server_would_refuse_is_refused_here(change, said):
    allocated = ALLOCATED | {(DRIVER, change.get("pool", POOL), change.get("device", VF0))}
    with pytest.raises(DeviceStatusError, match=said):
        network_status([nic(**change)], allocated)


def test_the_limits_themselves_pass():
    [entry] = network_status([nic(interface_name="x" * 256, hardware_address="a" * 128)],
                             ALLOCATED)
    assert len(entry["networkData"]["interfaceName"]) == 256


def test_addresses_are_canonical_kept_once_and_at_most_sixteen():
    ips = ("2001:0DB8:0:0::5/64", "2001:db8::5/64", "::ffff:192.168.0.1/120",
           *(f"10.0.0.{i}/24" for i in range(1, 20)))
    [entry] = network_status([nic(ips=ips)], ALLOCATED)
    got = entry["networkData"]["ips"]
    assert got[:3] == ["2001:db8::5/64", "192.168.0.1/24", "10.0.0.1/24"]
    assert len(got) == MAX_IPS and len(set(got)) == MAX_IPS


@given(st.ip_addresses(), st.integers(0, 128))
def test_a_canonical_address_reads_back_as_itself(ip, length):
    length = min(length, 32 if ip.version == 4 else 128)
    text = f"{ip}/{length}"
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return  # printed as its IPv4 form: another text, on purpose
    assert interface_address(text) == text
    assert interface_address(interface_address(text)) == interface_address(text)


def test_the_apply_body_names_the_claim_by_uid_and_only_our_entries():
    entries = network_status([nic()], ALLOCATED)
    body = status_apply("team", "train-pairs", "2b0c6e3e-8c7a-4f2e-9a51-3f1d2a7e4b10", entries)
    assert body == {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"namespace": "team", "name": "train-pairs",
                                 "uid": "2b0c6e3e-8c7a-4f2e-9a51-3f1d2a7e4b10"},
                    "status": {"devices": entries}}
    assert {e["driver"] for e in body["status"]["devices"]} == {DRIVER}
    assert FIELD_MANAGER == "railyard-agent"
