"""CPUs and memory in the simulator: pods ask theirs, nodes have theirs, nothing over-committed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.allocation.request import Request
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import Arrival
from railyard.sim.capacity import NodeCapacity, NodeResources
from railyard.sim.policies import Policy
from railyard.sim.run import DEFAULT_POLICIES, simulate
from railyard.sim.trace import TracePod

CLUSTER = "generic:2,dgx-h100:1"  # generic: 16 CPUs, 64 GiB, 2 GPUs


def test_a_node_has_the_cpus_and_memory_of_its_numa_nodes():
    generic, dgx = (next(t for t in cluster_from_spec(CLUSTER) if t.node.startswith(p))
                    for p in ("generic", "dgx-h100"))
    assert NodeCapacity.of(generic) == NodeCapacity(16_000, 64 * 1024, 2)
    assert NodeCapacity.of(dgx) == NodeCapacity(224_000, 2 * 1024 * 1024, 8)


def test_a_cpu_heavy_pod_fails_for_cpus_although_a_gpu_is_free():
    topologies = list(cluster_from_spec("generic:1"))
    heavy = TracePod("p", 10_000, 1024, 1, 1000)
    arrivals = [Arrival(i, f"u{i}", heavy, "plain", Request(gpus=1)) for i in range(2)]
    result = simulate(topologies, arrivals, ["best-fit", "railyard"], seed=0)
    for r in result.results.values():
        m = r.metrics.as_json()
        assert m["podsPlaced"] == 1 and m["podsFailedOnNodeFilters"] == 1
        assert m["freeGpus"] == 1


def test_resources_refuse_to_hold_more_than_a_node_has():
    topologies = list(cluster_from_spec("generic:1"))
    res = NodeResources(topologies)
    node = topologies[0].node
    res.hold("a", node, TracePod("a", 16_000, 1024, 0, 0))
    with pytest.raises(ValueError, match="does not fit node"):
        res.hold("b", node, TracePod("b", 1, 1, 0, 0))
    res.release("a")
    res.release("a")  # idempotent
    assert res.cpu_milli[node] == 0 and res.memory_mib[node] == 0


@st.composite
def heavy_arrivals(draw: st.DrawFn) -> list[Arrival]:
    """Pods whose CPUs or memory run out before GPUs do on the small nodes."""
    out = []
    for seq in range(draw(st.integers(1, 30))):
        gpus = draw(st.sampled_from([1, 1, 2]))
        cpu = draw(st.integers(0, 20_000))
        mem = draw(st.integers(0, 70 * 1024))
        arrive = float(draw(st.integers(0, 20)))
        life = draw(st.one_of(st.none(), st.integers(0, 20)))
        depart = None if life is None else arrive + life
        pod = TracePod(f"p{seq}", cpu, mem, gpus, 1000)
        out.append(Arrival(seq, f"u{seq}", pod, "plain", Request(gpus=gpus, vfs=gpus // 2),
                           arrive, depart))
    return out


@pytest.mark.parametrize("name", DEFAULT_POLICIES)
@settings(max_examples=20, deadline=None)
@given(arrivals=heavy_arrivals())
def test_cpus_and_memory_are_never_over_committed(name: str, arrivals: list[Arrival]) -> None:
    topologies = list(cluster_from_spec(CLUSTER))
    pods = {a.uid: a.pod for a in arrivals}

    def check(policy: Policy, res: NodeResources) -> None:
        for t in topologies:
            live = [pods[uid] for uid, _ in policy.ledgers()[t.node].holders()]
            cap = NodeCapacity.of(t)
            # What the resources hold is what the live pods on the node ask, within capacity.
            assert res.cpu_milli[t.node] == sum(p.cpu_milli for p in live) <= cap.cpu_milli
            assert res.memory_mib[t.node] == sum(p.memory_mib for p in live) <= cap.memory_mib

    simulate(topologies, arrivals, [name], seed=1, observer=check)
