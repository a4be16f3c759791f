"""The `fgd` baseline: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23).

FGD knows the *target workload*: how popular each task shape (CPUs, GPUs asked) is. For one
node and one shape, the node's fragmentation is the free GPU capacity that shape cannot use:
all of it when the task cannot run there at all (too few CPUs, or no GPU with room for it);
otherwise the free capacity of each GPU too small for the task's per-GPU demand (a share d:
the GPUs with less than d free; whole GPUs: the GPUs partly used). A node's expected
fragmentation weighs each shape's by its popularity. FGD puts each pod where this grows the
least (the "gradient"), over every node and every GPU the pod may take there; ties at random.
Written from the paper's definitions (section 3), not from its simulator's code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.sim.capacity import NodeCapacity
from railyard.sim.policies import Choice, DevicePolicy, ShareChoice
from railyard.sim.sharing import MILLI_PER_GPU
from railyard.topology.model import Gpu, NodeTopology

# A task shape: (CPU milli, GPUs, milli per GPU); a share has GPUs 1 and milli < 1000.
Shape = tuple[int, int, int]


class Workload:
    """The target workload: task shapes and their popularity, as arrays for one pass."""

    def __init__(self, shapes: Iterable[Shape] = ()) -> None:
        self.counts: Counter[Shape] = Counter(s for s in shapes if s[1] > 0)
        self._arrays: tuple[np.ndarray, ...] | None = None

    def add(self, shape: Shape) -> None:
        if shape[1] > 0:
            self.counts[shape] += 1
            self._arrays = None

    def arrays(self) -> tuple[np.ndarray, ...]:
        """Per shape: CPU milli, GPUs needed with room, the room each needs, popularity."""
        if self._arrays is None:
            shapes = sorted(self.counts)
            total = sum(self.counts.values()) or 1
            self._arrays = (np.array([s[0] for s in shapes], dtype=np.int64),
                            np.array([s[1] for s in shapes], dtype=np.int64),
                            np.array([s[2] for s in shapes], dtype=np.int64),
                            np.array([self.counts[s] / total for s in shapes]))
        return self._arrays


def expected_fragmentation(free_cpu_milli: int, free_gpu_milli: Sequence[int],
                           workload: Workload) -> float:
    """A node's expected fragmentation (milli-GPUs) for `workload`: per task shape, the free
    GPU capacity the shape cannot use, weighed by the shape's popularity."""
    cpu, count, room, weight = workload.arrays()
    if not len(weight):
        return 0.0
    free = np.sort(np.asarray(free_gpu_milli, dtype=np.int64))
    below = np.concatenate(([0], np.cumsum(free)))  # below[i]: the i smallest free
    total = int(below[-1])
    # GPUs with less free than a shape's per-GPU demand: its fragments where it can run.
    small = np.searchsorted(free, room, side="left")
    runs = (cpu <= free_cpu_milli) & (len(free) - small >= count)
    frag = np.where(runs, below[small], total)
    return float(weight @ frag)


class FgdPolicy(DevicePolicy):
    """FGD over the whole cluster: the node and GPUs whose taking grows the node's expected
    fragmentation least. Its workload is given (the run's arrivals, drawn from the trace);
    without one it learns shapes as pods arrive. It counts the CPUs its pods hold (the paper
    measures fragmentation over CPUs and GPUs); VFs at random, as kubelet picks them."""

    name = "fgd"

    def __init__(self, topologies: Sequence[NodeTopology], seed: int,
                 workload: Iterable[Shape] = ()) -> None:
        super().__init__(topologies, seed)
        self.workload = Workload(workload)
        self._learn = not self.workload.counts
        self._cpu_cap = {t.node: NodeCapacity.of(t).cpu_milli for t in self.topologies}
        self._cpu_used = dict.fromkeys(self._cpu_cap, 0)
        self._cpu_of: dict[str, tuple[str, int]] = {}  # pod uid -> (node, CPU milli)
        self._cpu_now = 0  # the pod being placed
        # (free CPU, free milli per GPU sorted, taken, CPU taken) -> growth: identical nodes
        # in identical states (most of a large cluster, early on) are measured once.
        self._memo: dict[tuple, float] = {}

    def _free(self, node: str) -> tuple[int, list[int]]:
        """Free CPU milli and free milli per GPU of `node`."""
        shared = self.shares.used_on(node)
        whole, _ = self.free_counts(node)
        return (self._cpu_cap[node] - self._cpu_used[node],
                [MILLI_PER_GPU] * whole + [MILLI_PER_GPU - u for u in shared.values()])

    def _delta(self, node: str, take: Sequence[tuple[int, int]], cpu: int) -> float:
        """How much `node`'s expected fragmentation grows when a pod takes `cpu` CPU milli
        and, per (free, taken) in `take`, `taken` milli of a GPU with `free` milli free."""
        free_cpu, free = self._free(node)
        key = (free_cpu, tuple(sorted(free)), tuple(take), cpu)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        before = expected_fragmentation(free_cpu, free, self.workload)
        after = list(free)
        for have, got in take:
            after.remove(have)
            after.append(have - got)
        delta = expected_fragmentation(free_cpu - cpu, after, self.workload) - before
        self._memo[key] = delta
        return delta

    def place(self, uid: str, request: Request, nodes: Sequence[str] | None = None, *,
              job: str | None = None, gpu_milli: int = MILLI_PER_GPU,
              cpu_milli: int = 0) -> Allocation | Infeasible:
        if self._learn:
            self.workload.add((cpu_milli, request.gpus, gpu_milli))
            self._memo.clear()
        self._cpu_now = cpu_milli
        result = super().place(uid, request, nodes, job=job, gpu_milli=gpu_milli,
                               cpu_milli=cpu_milli)
        if isinstance(result, Allocation):
            self._cpu_of[uid] = (result.node, cpu_milli)
            self._cpu_used[result.node] += cpu_milli
        return result

    def release(self, uid: str) -> None:
        super().release(uid)
        held = self._cpu_of.pop(uid, None)
        if held is not None:
            self._cpu_used[held[0]] -= held[1]

    def choose(self, nodes: list[str], request: Request) -> Choice | Infeasible:
        # Whole GPUs: any free ones leave the node in the same state, so one trial per node.
        take = [(MILLI_PER_GPU, MILLI_PER_GPU)] * request.gpus
        node = self.pick_tied([(-self._delta(n, take, self._cpu_now), n) for n in nodes])
        gpus = self.rng.sample(self.free_gpus(node), request.gpus)
        return node, gpus, self.rng.sample(self.free_vfs(node), request.vfs)

    def choose_share(self, nodes: list[str], request: Request,
                     milli: int) -> ShareChoice | Infeasible:
        # A share: one trial per node and distinct free amount (GPUs with as much free are
        # alike to the measure), then a GPU with that much free, at random.
        scored: list[tuple[float, str]] = []
        best: dict[str, list[tuple[float, int, list[Gpu]]]] = {}
        for n in nodes:
            by_free: dict[int, list[Gpu]] = {}
            for g, free in self.share_options(n, milli):
                by_free.setdefault(free, []).append(g)
            trials = [(-self._delta(n, [(free, milli)], self._cpu_now), free, gpus)
                      for free, gpus in by_free.items()]
            top = max(t[0] for t in trials)
            best[n] = [t for t in trials if t[0] == top]
            scored.append((top, n))
        node = self.pick_tied(scored)
        _, _, gpus = self.rng.choice(best[node])
        return node, self.rng.choice(gpus), self.rng.sample(self.free_vfs(node), request.vfs)
