"""The extender's ClusterSync decodes a pod's record once: the watch brings the same record
back with each later change of the pod (bound, running, status), and decoding it each time
was ~5 % of the extender's CPU on the box (issue 28). A changed record, a finished pod and a
pod that comes back after its DELETED are read afresh."""

from __future__ import annotations

import pytest
from api_objects import pod, synced, topology
from scheduler_helpers import hand_allocation

import railyard.scheduler.cluster_api as cluster_api
from railyard.kube.reflector import Change

T = topology("a")
FIRST = hand_allocation(T, [(0, 0, 0)])
SECOND = hand_allocation(T, [(1, 0, 1)])


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The record texts ClusterSync decodes, in order."""
    seen: list[str] = []
    real = cluster_api.decode_allocation

    def counting(text: str, what: str) -> object:
        seen.append(text)
        return real(text, what)

    monkeypatch.setattr(cluster_api, "decode_allocation", counting)
    return seen


def test_the_same_record_on_later_changes_is_decoded_once(decodes: list[str]) -> None:
    sync = synced("a")
    sync.on_pod(Change("ADDED", "u1", pod("u1", FIRST, phase="Pending")))
    for phase in ("Pending", "Running", "Running"):
        sync.on_pod(Change("MODIFIED", "u1", pod("u1", FIRST, phase=phase)))
    assert len(decodes) == 1
    held = sync.state.pod("u1")
    assert held is not None and held.allocation == FIRST


def test_a_changed_record_is_decoded_and_held(decodes: list[str]) -> None:
    sync = synced("a")
    sync.on_pod(Change("ADDED", "u1", pod("u1", FIRST)))
    sync.on_pod(Change("MODIFIED", "u1", pod("u1", SECOND)))
    assert len(decodes) == 2
    held = sync.state.pod("u1")
    assert held is not None and held.allocation == SECOND


def test_a_finished_pod_with_the_same_record_frees_its_devices(decodes: list[str]) -> None:
    sync = synced("a")
    sync.on_pod(Change("ADDED", "u1", pod("u1", FIRST)))
    sync.on_pod(Change("MODIFIED", "u1", pod("u1", FIRST, phase="Succeeded")))
    assert sync.state.pod("u1") is None
    assert not sync.has_record("u1")


def test_a_pod_back_after_deleted_is_decoded_again(decodes: list[str]) -> None:
    sync = synced("a")
    sync.on_pod(Change("ADDED", "u1", pod("u1", FIRST)))
    sync.on_pod(Change("DELETED", "u1", pod("u1", FIRST)))
    assert sync.state.pod("u1") is None
    sync.on_pod(Change("ADDED", "u1", pod("u1", FIRST)))
    assert len(decodes) == 2
    assert sync.state.pod("u1") is not None


def test_another_pods_identical_record_is_decoded_for_it(decodes: list[str]) -> None:
    """The memo is per pod: the same text on another pod is that pod's own record."""
    sync = synced("a")
    sync.on_pod(Change("ADDED", "u1", pod("u1", FIRST)))
    sync.on_pod(Change("DELETED", "u1", pod("u1", FIRST)))
    sync.on_pod(Change("ADDED", "u2", pod("u2", FIRST)))
    assert len(decodes) == 2
    assert sync.state.pod("u2") is not None
