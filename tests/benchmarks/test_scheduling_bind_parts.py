"""The Binding create's parts on the extender's side of the wire (rate limit, connection,
wire) and its loop's lag, from the extender's own /metrics as benchmarks/scheduling.py reads
them over a round: what was observed before the round does not count."""

from __future__ import annotations

import asyncio

from railyard.kube.client import RequestTiming
from railyard.scheduler.metrics import LAG_PROBE_S, Metrics
from scheduling import bind_phases


def test_the_round_reads_each_part_of_the_binding_create_apart():
    metrics = Metrics()
    for _ in range(50):  # before the round: all in the limiter
        metrics.write_timing(RequestTiming(limit_s=4.0, connection_s=0.0, wire_s=0.001))
    before = metrics.render().decode()
    for _ in range(100):
        metrics.write_timing(RequestTiming(limit_s=0.0004, connection_s=1.7, wire_s=0.03))
    phases = bind_phases(before, metrics.render().decode())
    assert phases["limitP99Ms"] <= 0.5
    assert 1500 <= phases["connectionP50Ms"] <= 2000  # in the 1.5-2 s bucket
    assert 20 <= phases["wireP99Ms"] <= 50
    assert "decideP50Ms" not in phases  # nothing decided in the round


def test_a_loop_held_by_other_work_shows_as_lag():
    metrics = Metrics()

    async def main() -> None:
        probe = metrics.probe_loop_lag()
        await anext(probe)
        await asyncio.sleep(LAG_PROBE_S / 2)  # the probe's timer is now pending
        end = asyncio.get_running_loop().time() + 3 * LAG_PROBE_S
        while asyncio.get_running_loop().time() < end:  # hold the loop, as a busy one would
            pass
        await asyncio.sleep(2 * LAG_PROBE_S)
        await probe.aclose()

    before = metrics.render().decode()
    asyncio.run(main())
    phases = bind_phases(before, metrics.render().decode())
    assert phases["loopLagP99Ms"] >= 100  # the timer ran at least 2.5 probes late


def test_a_processs_cpu_wait_sums_its_threads_run_queue_delay():
    import os
    import threading
    from pathlib import Path

    from scheduling import cpu_wait_seconds

    done = threading.Event()
    worker = threading.Thread(target=done.wait)
    worker.start()
    try:
        main_thread = int(Path(f"/proc/self/task/{os.getpid()}/schedstat").read_text()
                          .split()[1]) / 1e9
        assert cpu_wait_seconds(os.getpid()) >= main_thread
    finally:
        done.set()
        worker.join()
    assert cpu_wait_seconds(2 ** 22 + 1) == 0.0  # above pid_max: no such process
