"""Where a bind's time goes: the decide and write phases and where each allocation was
decided (issue 28's "why did binds queue", answered from the extender's own metrics)."""

from __future__ import annotations

from scheduler_helpers import args, calls, pod

from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState


def _bind(uid: str, node: str) -> dict[str, str]:
    return {"PodName": f"pod-{uid}", "PodNamespace": "default", "PodUID": uid, "Node": node}


def _sample(metrics: str, name: str) -> float:
    (line,) = [ln for ln in metrics.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[-1])


def test_a_bind_decided_from_filters_memo_and_one_searched_again_are_told_apart():
    ext = Extender(ClusterState(cluster_from_spec("dgx-h100:1")), filter_ranks=False)
    names = ext.state.node_names()
    first, second = pod("u1", gpus=2, vfs=2), pod("u2", gpus=2, vfs=2)
    # Both filtered before either binds: the first bind changes the node, so the second's
    # answer from filter no longer holds and it is searched again in the worker.
    calls(ext, [("filter", args(first, names)), ("filter", args(second, names))])
    assert calls(ext, [("bind", _bind("u1", names[0])), ("bind", _bind("u2", names[0]))]) \
        == [{"Error": ""}, {"Error": ""}]
    text = ext.metrics.render().decode()
    assert _sample(text, 'railyard_extender_bind_decisions_total{where="memo"}') == 1.0
    assert _sample(text, 'railyard_extender_bind_decisions_total{where="worker"}') == 1.0
    for phase in ("decide", "write"):
        assert _sample(text, f'railyard_extender_bind_phase_seconds_count{{phase="{phase}"}}') \
            == 2.0


def test_a_pod_without_devices_is_not_counted_as_a_decision():
    ext = Extender(ClusterState(cluster_from_spec("dgx-h100:1")))
    names = ext.state.node_names()
    plain = pod("u3", gpus=0, vfs=0)
    calls(ext, [("filter", args(plain, names))])
    assert calls(ext, [("bind", _bind("u3", names[0]))]) == [{"Error": ""}]
    text = ext.metrics.render().decode()
    assert _sample(text, 'railyard_extender_bind_decisions_total{where="memo"}') == 0.0
    assert _sample(text, 'railyard_extender_bind_phase_seconds_count{phase="decide"}') == 0.0
