"""Which health changes become Events on the Node, and what they say
(`kubelet.health_events`): one per change, none for a scan that changes nothing, a flapping
device bounded to one per interval, and a restart telling nothing already told."""

from __future__ import annotations

from railyard.kubelet.health_events import (
    MESSAGE_BUDGET_BYTES,
    Device,
    HealthChanges,
    HealthNews,
    devices_by_id,
    healthy_message,
    unhealthy_message,
)
from support.agent import topology

TOPO = topology()
NIC = TOPO.nics[0]
PF = NIC.pci_address
VFS = [v.pci_address for v in NIC.vfs]
GPU = TOPO.gpus[0]
DOWN = f"PF {NIC.netdev} link is down"
LINK_DOWN = {PF: DOWN} | {v: DOWN for v in VFS}


def test_devices_are_known_by_plugin_id_with_their_kind_and_pci_address():
    known = devices_by_id(TOPO)
    assert known[GPU.device_id] == Device("GPU", GPU.pci_address)
    assert known[PF] == Device("PF", PF)
    assert known[VFS[0]] == Device("VF", VFS[0])


def test_unhealthy_then_healthy_is_told_twice_and_an_unchanged_scan_not_at_all():
    changes = HealthChanges(TOPO)
    assert changes.update({}, 0.0) == HealthNews()
    down = changes.update(LINK_DOWN, 1.0)
    assert down.unhealthy == ((Device("PF", PF), DOWN),
                              *((Device("VF", v), DOWN) for v in VFS))
    assert down.healthy == ()
    assert changes.update(LINK_DOWN, 2.0) == HealthNews()  # still down: nothing new
    up = changes.update({}, 40.0)
    assert up == HealthNews((), (Device("PF", PF), *(Device("VF", v) for v in VFS)))
    assert changes.update({}, 41.0) == HealthNews()


def test_a_gpu_is_told_by_its_pci_address_not_its_uuid():
    news = HealthChanges(TOPO).update({GPU.device_id: "GPU gone"}, 0.0)
    assert news.unhealthy == ((Device("GPU", GPU.pci_address), "GPU gone"),)


def test_a_flapping_device_is_told_at_most_once_per_interval_and_its_last_state_at_the_end():
    changes = HealthChanges(TOPO, interval_s=30.0)
    told = []
    for second in range(60):  # down on even seconds, up on odd ones
        news = changes.update(LINK_DOWN if second % 2 == 0 else {}, float(second))
        if news != HealthNews():
            told.append((second, bool(news.unhealthy), bool(news.healthy)))
    assert told == [(0, True, False), (31, False, True)]
    # It settles down: told once the quiet time after the last Event is up, not before.
    assert changes.update(LINK_DOWN, 60.0) == HealthNews()
    assert changes.update(LINK_DOWN, 61.0).unhealthy


def test_a_change_held_back_is_dropped_when_the_device_changes_back_in_time():
    changes = HealthChanges(TOPO, interval_s=30.0)
    changes.update(LINK_DOWN, 0.0)
    assert changes.update({}, 5.0) == HealthNews()  # held
    assert changes.update(LINK_DOWN, 10.0) == HealthNews()
    assert changes.update(LINK_DOWN, 31.0) == HealthNews()  # down, as told: nothing to say


def test_devices_the_found_status_lists_are_not_told_again_after_a_restart():
    changes = HealthChanges(TOPO, reported=dict(LINK_DOWN))
    assert changes.update(LINK_DOWN, 0.0) == HealthNews()
    assert changes.update({}, 1.0).healthy  # but their recovery is


def test_the_unhealthy_message_names_each_device_with_its_kind_grouped_by_why():
    news = HealthChanges(TOPO).update(LINK_DOWN | {GPU.device_id: "GPU gone"}, 0.0)
    message = unhealthy_message(news.unhealthy)
    assert message.startswith("not healthy: ")
    assert f"PF {PF}, " + ", ".join(f"VF {v}" for v in VFS) + f" ({DOWN})" in message
    assert f"GPU {GPU.pci_address} (GPU gone)" in message
    assert healthy_message([Device("PF", PF), Device("VF", VFS[0])]) == (
        f"healthy again: PF {PF}, VF {VFS[0]}")


def test_a_message_about_more_devices_than_fit_counts_the_rest():
    many = [(Device("VF", f"0000:18:{i // 8:02x}.{i % 8}"), "PF ib0 link is down")
            for i in range(127)]
    message = unhealthy_message(many)
    assert len(message.encode()) <= MESSAGE_BUDGET_BYTES + 80
    named = message.count("VF ")
    assert 0 < named < 127 and message.endswith(f"; and {127 - named} more")
