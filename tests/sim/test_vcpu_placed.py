"""vcpuPlaced and vcpuHoursPlaced on hand-made runs whose answers are worked out by hand."""

from __future__ import annotations

import pytest

from railyard.allocation.request import Request
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import Arrival
from railyard.sim.report import console_rows
from railyard.sim.run import DEFAULT_POLICIES, simulate
from railyard.sim.trace import TracePod

HOUR = 3600.0


def arrival(seq: int, gpus: int, vcpus: int, arrive: float, depart: float | None) -> Arrival:
    pod = TracePod(f"p{seq}", vcpus * 1000, 1024, gpus, 1000 if gpus else 0)
    return Arrival(seq, f"u{seq}", pod, "plain", Request(gpus=gpus), arrive, depart)


# One DGX H100 (8 GPUs). By hand:
# - u0: 8 GPUs, 10 vCPUs, 0 s -> 3600 s: placed; 10 vCPU x 1 h = 10.
# - u1: 1 GPU, 4 vCPUs at 1800 s: all 8 GPUs are held, refused (counts nothing).
# - u2: 2 GPUs, 6 vCPUs at 3600 s (u0 leaves first), never leaves: placed; it runs to the
#   run's last event, u3's departure at 9000 s: 6 x 1.5 h = 9.
# - u3: 1 GPU, 2 vCPUs, 7200 s -> 9000 s: placed; 2 x 0.5 h = 1.
# - u4: 1 GPU, 100,000 vCPUs at 7200 s: no node has the CPUs, refused.
# vcpuPlaced = 10 + 6 + 2 = 18; vcpuHoursPlaced = 10 + 9 + 1 = 20.
TIMED = [
    arrival(0, 8, 10, 0.0, HOUR),
    arrival(1, 1, 4, 1800.0, 5400.0),
    arrival(2, 2, 6, HOUR, None),
    arrival(3, 1, 2, 2 * HOUR, 2.5 * HOUR),
    arrival(4, 1, 100_000, 2 * HOUR, 2.5 * HOUR),
]


@pytest.mark.parametrize("name", DEFAULT_POLICIES)
def test_vcpus_and_vcpu_hours_of_placed_pods_on_a_timed_run(name: str) -> None:
    result = simulate(list(cluster_from_spec("dgx-h100:1")), TIMED, [name], seed=0)
    m = result.metrics_json(with_latency=False)[name]
    assert m["podsPlaced"] == 3
    assert m["vcpuPlaced"] == 18
    assert m["vcpuHoursPlaced"] == pytest.approx(20.0)


def test_a_run_without_lifetimes_has_vcpus_placed_and_no_vcpu_hours() -> None:
    # Drawn pods stay: u0 (8 GPUs, 10 vCPUs) is placed, u1 finds no GPU, u2 no CPUs.
    drawn = [arrival(0, 8, 10, 0.0, None), arrival(1, 1, 3, 0.0, None),
             arrival(2, 0, 100_000, 0.0, None)]
    result = simulate(list(cluster_from_spec("dgx-h100:1")), drawn, ["railyard", "best-fit"],
                      seed=0)
    for m in result.metrics_json(with_latency=False).values():
        assert m["vcpuPlaced"] == 10
        assert m["vcpuHoursPlaced"] is None
    rows = dict(console_rows(result))
    assert rows["vCPUs placed"] == ["10", "10"]
    assert rows["vCPU-hours placed"] == ["–", "–"]


def test_a_pod_leaving_at_its_arrival_runs_no_time_but_was_placed() -> None:
    # u0 leaves the moment it arrives; u1 (4 vCPUs) runs 0 -> 7200 s: 8 vCPU-hours.
    runs = [arrival(0, 1, 5, 0.0, 0.0), arrival(1, 1, 4, 0.0, 2 * HOUR)]
    result = simulate(list(cluster_from_spec("dgx-h100:1")), runs, ["railyard"], seed=0)
    m = result.metrics_json(with_latency=False)["railyard"]
    assert m["vcpuPlaced"] == 9
    assert m["vcpuHoursPlaced"] == pytest.approx(8.0)
