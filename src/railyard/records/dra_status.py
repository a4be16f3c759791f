"""A claim's `status.devices` for our NICs: each one's interface in the pod, its MAC and its
addresses (KEP-4817's network data), as the agent writes them after railyard-cni's ADD.

Pure: `network_status(...)` builds our driver's entries, bounded and checked as kube-apiserver
v1.36.3 checks them (pkg/apis/resource/validation `validateDeviceStatus`), so a write is never
refused for its form; `status_apply(...)` is the server-side apply body that carries them.
The API server merges the list by its keys (driver, pool, device, shareID: `listType=map`),
so an apply of ours names only our entries and leaves every other driver's (NVIDIA's GPUs)
as they are (decision 0113).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from railyard.records.dra_names import DRIVER
from railyard.records.fields import is_dns_label, is_dns_subdomain

API_VERSION = "resource.k8s.io/v1"
FIELD_MANAGER = "railyard-agent"  # the agent's server-side apply manager for these entries

# The API server's limits (k8s.io/api@v0.36.3 resource/v1/types.go, `NetworkDeviceData`).
MAX_IPS = 16  # NetworkDeviceDataMaxIPs
MAX_INTERFACE_NAME_BYTES = 256  # NetworkDeviceDataInterfaceNameMaxLength
MAX_HARDWARE_ADDRESS_BYTES = 128  # NetworkDeviceDataHardwareAddressMaxLength
MAX_DRIVER = 63  # validateDriverName: a DNS subdomain of at most 63 characters
MAX_POOL = 253  # validatePoolName: DNS subdomains joined by "/", at most 253 in all


class DeviceStatusError(ValueError):
    """An entry the API server would refuse; the message names the device and the rule."""


@dataclass(frozen=True, slots=True)
class NicNetwork:
    """One of our NIC devices of a claim as the pod has it: its slice name and pool, the
    interface railyard-cni named it in the pod, its MAC and its addresses (CIDR form)."""

    device: str
    pool: str
    interface_name: str
    hardware_address: str | None
    ips: tuple[str, ...] = ()


DeviceKey = tuple[str, str, str]  # (driver, pool, device) of an allocation result


def interface_address(text: str) -> str:
    """An address in the form the API server wants: an interface address with its prefix
    length, canonical as Go prints it (`10.56.0.2/16`, `2001:db8::5/64`; an IPv4-mapped IPv6
    address as its IPv4 one). ValueError for anything else (a bare address, a mask form)."""
    if "/" not in text:
        raise ValueError("no prefix length (expected address/length)")
    if "%" in text:
        raise ValueError("a zoned address (Go's ParseCIDR takes none)")
    iface = ipaddress.ip_interface(text)
    ip, length = iface.ip, iface.network.prefixlen
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        # apimachinery's IsValidInterfaceAddress reads it as IPv4 with 96 bits less prefix.
        if length < 96:
            raise ValueError("an IPv4-mapped address with a prefix shorter than 96")
        return f"{ip.ipv4_mapped}/{length - 96}"
    return f"{ip}/{length}"


def network_status(nics: Iterable[NicNetwork], allocated: frozenset[DeviceKey], *,
                   driver: str = DRIVER) -> list[dict[str, Any]]:
    """Our entries of `status.devices`, one per NIC, in the order given.

    Refused (DeviceStatusError): a device not among the claim's allocation results (the API
    server's "must be an allocated device in the claim"), one named twice, a name or pool the
    API would refuse, an interface name or MAC over its limit, an address that is not one.
    Addresses are made canonical and kept once each, the first MAX_IPS of them.
    """
    if not is_dns_subdomain(driver, MAX_DRIVER):
        raise DeviceStatusError(f"driver {driver!r}: not a DNS subdomain of at most "
                                f"{MAX_DRIVER} characters")
    entries: list[dict[str, Any]] = []
    seen: set[DeviceKey] = set()
    for nic in nics:
        key = (driver, nic.pool, nic.device)
        where = f"device {driver}/{nic.pool}/{nic.device}"
        if not is_dns_label(nic.device):
            raise DeviceStatusError(f"{where}: the device name is not a DNS label")
        if len(nic.pool) > MAX_POOL or not all(is_dns_subdomain(s)
                                               for s in nic.pool.split("/")):
            raise DeviceStatusError(f"{where}: the pool name is not DNS subdomains joined by "
                                    f"'/' (at most {MAX_POOL} characters)")
        if key not in allocated:
            raise DeviceStatusError(f"{where}: not a device of the claim's allocation (the "
                                    "API server takes status only for allocated devices)")
        if key in seen:
            raise DeviceStatusError(f"{where}: named twice")
        seen.add(key)
        data: dict[str, Any] = {}
        if nic.interface_name:
            if len(nic.interface_name.encode()) > MAX_INTERFACE_NAME_BYTES:
                raise DeviceStatusError(f"{where}: interface name over "
                                        f"{MAX_INTERFACE_NAME_BYTES} bytes")
            data["interfaceName"] = nic.interface_name
        ips: list[str] = []
        for text in nic.ips:
            try:
                ip = interface_address(text)
            except ValueError as e:
                raise DeviceStatusError(f"{where}: address {text!r}: {e}") from None
            if ip not in ips:
                ips.append(ip)
        if ips:
            data["ips"] = ips[:MAX_IPS]
        if nic.hardware_address:
            if len(nic.hardware_address.encode()) > MAX_HARDWARE_ADDRESS_BYTES:
                raise DeviceStatusError(f"{where}: hardware address over "
                                        f"{MAX_HARDWARE_ADDRESS_BYTES} bytes")
            data["hardwareAddress"] = nic.hardware_address
        entry: dict[str, Any] = {"driver": driver, "pool": nic.pool, "device": nic.device}
        if data:
            entry["networkData"] = data
        entries.append(entry)
    return entries


def status_apply(namespace: str, name: str, uid: str,
                 entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The server-side apply body of the claim's status subresource: our entries only. The
    UID makes it apply to this claim and no other made since under its name (the API server
    refuses a changed UID)."""
    return {"apiVersion": API_VERSION, "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"devices": entries}}
