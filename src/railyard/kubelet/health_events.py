"""Which device health changes the agent tells people about as Events on its Node, and what
the Events say. Pure: the agent's health scan feeds each result in with the time, and writes
what comes out (`agent.Agent`, through `kube.events`).

A device's change is told at once, then the device is quiet for `interval_s`: a change in that
time is held, and told when the time is up only if the device still differs from what was last
told. So a flapping link costs at most one Event per device per `interval_s`, and the last
Event about a device always matches its health once it settles. The scan's log keeps every
change (docs/agent.md, "Events").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from railyard.topology.model import NodeTopology

UNHEALTHY = "RailyardDeviceUnhealthy"
HEALTHY = "RailyardDeviceHealthy"
# Long enough that a link flapping every health scan (1 s) writes two Events a minute per
# device rather than sixty; short enough that a repair shows within half a minute.
EVENT_INTERVAL_S = 30.0
# Room kept in a message for the count of devices left out (kube.events caps it at 1 KiB).
MESSAGE_BUDGET_BYTES = 1024 - 80


@dataclass(frozen=True, slots=True)
class Device:
    kind: str  # "GPU", "PF" or "VF"
    pci_address: str


@dataclass(frozen=True, slots=True)
class HealthNews:
    """What one scan has to tell: devices now unhealthy (with why), devices healthy again."""

    unhealthy: tuple[tuple[Device, str], ...] = ()
    healthy: tuple[Device, ...] = ()


def devices_by_id(topology: NodeTopology) -> dict[str, Device]:
    """Device plugin ID (a GPU's UUID, a NIC's PCI address) → the device."""
    out = {g.device_id: Device("GPU", g.pci_address) for g in topology.gpus}
    for nic in topology.nics:
        out[nic.pci_address] = Device("PF", nic.pci_address)
        out.update((v.pci_address, Device("VF", v.pci_address)) for v in nic.vfs)
    return out


class HealthChanges:
    """`reported`: PCI address → why, the devices already told unhealthy (those a
    NodeTopology status found at start lists), so an agent's restart tells nothing again."""

    def __init__(self, topology: NodeTopology, reported: Mapping[str, str] | None = None,
                 interval_s: float = EVENT_INTERVAL_S) -> None:
        self.devices = devices_by_id(topology)
        self.kinds = {d.pci_address: d.kind for d in self.devices.values()}
        self.interval_s = interval_s
        self.reported: dict[str, str] = dict(reported or {})
        self._told_at: dict[str, float] = {}  # PCI address → when its last change was told

    def update(self, unhealthy: Mapping[str, str], now_s: float) -> HealthNews:
        """`unhealthy`: device plugin ID → why (the health scan); `now_s`: a monotonic
        clock. The changes to tell now, which then count as told."""
        bad = {self._device(i).pci_address: why for i, why in unhealthy.items()}
        gone_bad: list[tuple[Device, str]] = []
        came_back: list[Device] = []
        for pci in sorted(bad.keys() ^ self.reported.keys()):
            told = self._told_at.get(pci)
            if told is not None and now_s - told < self.interval_s:
                continue  # held: told again once its quiet time is up, if still changed
            self._told_at[pci] = now_s
            device = Device(self.kinds.get(pci, "device"), pci)
            if pci in bad:
                gone_bad.append((device, bad[pci]))
                self.reported[pci] = bad[pci]
            else:
                came_back.append(device)
                del self.reported[pci]
        # Forget quiet times that are over: the memory is the devices changing now.
        for pci in [p for p, t in self._told_at.items() if now_s - t >= self.interval_s]:
            del self._told_at[pci]
        return HealthNews(tuple(gone_bad), tuple(came_back))

    def _device(self, device_id: str) -> Device:
        return self.devices.get(device_id) or Device("device", device_id)


def unhealthy_message(devices: Iterable[tuple[Device, str]]) -> str:
    """`PF 0000:18:00.0, VF 0000:18:00.2 (PF ibp24s0 link is down); GPU …`: the devices,
    grouped by why in the order they come."""
    groups: dict[str, list[Device]] = {}
    for device, why in devices:
        groups.setdefault(why, []).append(device)
    return "not healthy: " + _listing([(f" ({why})", ds) for why, ds in groups.items()])


def healthy_message(devices: Iterable[Device]) -> str:
    return "healthy again: " + _listing([("", list(devices))])


def _listing(groups: list[tuple[str, list[Device]]]) -> str:
    """Groups joined by `; `, each its devices then its suffix; devices past the message
    budget are counted, not named (the NodeTopology's status lists every unhealthy one)."""
    parts: list[str] = []
    used, left_out = 0, 0
    for suffix, devices in groups:
        named: list[str] = []
        for d in devices:
            text = f"{d.kind} {d.pci_address}"
            cost = len(text) + 2 + len(suffix.encode())
            if left_out or used + cost > MESSAGE_BUDGET_BYTES:
                left_out += 1
                continue
            named.append(text)
            used += len(text) + 2
        if named:
            parts.append(", ".join(named) + suffix)
            used += len(suffix.encode())
    more = f"; and {left_out} more" if left_out else ""
    return "; ".join(parts) + more
