"""CPUs, memory and placement rules in the simulator: what kube-scheduler checks before it
asks any extender.

kube-scheduler's NodeResourcesFit filter admits a pod to a node only while the requests of the
pods there plus its own stay within the node's allocatable CPU and memory; Railyard's
extender (and every baseline) is asked only about the nodes that pass. `NodeResources` is that
filter over the simulated cluster: a node's CPUs and memory are its topology's (every CPU
`numa_nodes` lists, 1000 milli each; their memory), and a pod asks the `cpu_milli` and
`memory_mib` of its trace row. Nothing is over-committed. Two rules of the DLRM trace are
checked here too, as a node selector and pod anti-affinity would be: a `CN` instance runs on
a node without GPUs, an `HN` one on a node with them; and at most `max_instance_per_node`
instances of one application share a node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from railyard.sim.trace import TracePod
from railyard.topology.model import NodeTopology

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    cpu_milli: int
    memory_mib: int
    gpus: int = 0

    @classmethod
    def of(cls, t: NodeTopology) -> NodeCapacity:
        return cls(1000 * sum(len(n.cpu_ids) for n in t.numa_nodes),
                   sum(n.memory_bytes for n in t.numa_nodes) // MiB, len(t.gpus))


class NodeResources:
    """CPU and memory held per node by the live pods a policy placed (mutable, no I/O)."""

    def __init__(self, topologies: Iterable[NodeTopology]) -> None:
        self.capacity: dict[str, NodeCapacity] = {}
        for t in topologies:
            self.capacity[t.node] = NodeCapacity.of(t)
        self.names = list(self.capacity)
        self.cpu_milli = dict.fromkeys(self.names, 0)
        self.memory_mib = dict.fromkeys(self.names, 0)
        self._held: dict[str, tuple[str, TracePod]] = {}  # pod uid -> (node, pod)
        self.instances: Counter[tuple[str, str]] = Counter()  # (node, app) -> live pods

    def fits(self, node: str, pod: TracePod) -> bool:
        cap = self.capacity[node]
        if pod.role is not None and (pod.role == "HN") != (cap.gpus > 0):
            return False
        if (pod.max_per_node is not None and pod.app is not None
                and self.instances[node, pod.app] >= pod.max_per_node):
            return False
        return (self.cpu_milli[node] + pod.cpu_milli <= cap.cpu_milli
                and self.memory_mib[node] + pod.memory_mib <= cap.memory_mib)

    def candidates(self, pod: TracePod) -> list[str]:
        """The nodes `pod` fits on now, in cluster order."""
        return [n for n in self.names if self.fits(n, pod)]

    def hold(self, uid: str, node: str, pod: TracePod) -> None:
        if uid in self._held:
            raise ValueError(f"pod {uid} already holds CPU and memory")
        if not self.fits(node, pod):
            raise ValueError(f"pod {uid} does not fit node {node} (CPU, memory or rules)")
        self._held[uid] = (node, pod)
        self.cpu_milli[node] += pod.cpu_milli
        self.memory_mib[node] += pod.memory_mib
        if pod.app is not None:
            self.instances[node, pod.app] += 1

    def release(self, uid: str) -> None:
        """Free what `uid` holds; nothing when it holds nothing."""
        held = self._held.pop(uid, None)
        if held is not None:
            node, pod = held
            self.cpu_milli[node] -= pod.cpu_milli
            self.memory_mib[node] -= pod.memory_mib
            if pod.app is not None:
                self.instances[node, pod.app] -= 1

    def holders(self, node: str) -> list[TracePod]:
        return [pod for n, pod in self._held.values() if n == node]
