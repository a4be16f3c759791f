"""Shared GPUs in the simulator (decision 0094): one account of the milli-GPUs held per GPU.

openb asks a share of one GPU on 38% of its pods (`gpu_milli` < 1000 with `num_gpu` 1). In the
simulator such a pod shares a GPU with others whose shares sum to at most 1000; every other
GPU pod takes whole GPUs. Railyard's allocator never shares (its `Ledger` holds whole GPUs),
so a GPU that holds shares is held in a policy's ledger by one stand-in holder
(`shared-gpu/…`) while any share is live, and this account says how much of it is used. Every
policy keeps one, so each places shares by its own rule on the same accounting.
"""

from __future__ import annotations

from dataclasses import dataclass

from railyard.sim.trace import TracePod

MILLI_PER_GPU = 1000


def shares_gpu(pod: TracePod) -> bool:
    """Whether `pod` asks a share of one GPU rather than whole GPUs."""
    return pod.num_gpu == 1 and 0 < pod.gpu_milli < MILLI_PER_GPU


def gpu_milli_of(pod: TracePod) -> int:
    """The milli-GPUs `pod` asks in all: its share of one GPU, else 1000 per GPU. Demand and
    allocation are counted in these (`gpuAllocationRatio` counts a share as milli/1000)."""
    return pod.gpu_milli if shares_gpu(pod) else MILLI_PER_GPU * pod.num_gpu


def share_of(pod: TracePod) -> int:
    """What a policy is asked to place per GPU: the share, or 1000 (whole GPUs)."""
    return pod.gpu_milli if shares_gpu(pod) else MILLI_PER_GPU


class ShareError(ValueError):
    """A share that does not fit the GPU, or a pod holding two: a bug in a policy."""


@dataclass(frozen=True, slots=True)
class Share:
    node: str
    gpu: str  # PCI address
    milli: int


class GpuShares:
    """Milli-GPUs held on each shared GPU, and by each pod (mutable, no I/O).

    A GPU is *shared* while it holds at least one share; it then holds at most 1000 (checked
    on every `hold`). `holder(node, gpu)` names the stand-in that holds the whole GPU in the
    policy's ledger meanwhile, so whole-GPU pods never get it.
    """

    def __init__(self) -> None:
        self._used: dict[str, dict[str, int]] = {}  # node -> GPU -> milli held
        self._holders: dict[tuple[str, str], str] = {}  # (node, GPU) -> ledger stand-in
        self._held: dict[str, Share] = {}  # pod uid -> its share

    def used_on(self, node: str) -> dict[str, int]:
        """The shared GPUs of `node` and the milli each holds (a copy)."""
        return dict(self._used.get(node, {}))

    def used(self, node: str, gpu: str) -> int:
        return self._used.get(node, {}).get(gpu, 0)

    def held_by(self, uid: str) -> Share | None:
        return self._held.get(uid)

    def holder(self, node: str, gpu: str) -> str | None:
        """The ledger stand-in holding a shared GPU; None when the GPU holds no share."""
        return self._holders.get((node, gpu))

    def total_milli(self) -> int:
        return sum(s.milli for s in self._held.values())

    def hold(self, uid: str, node: str, gpu: str, milli: int, holder: str) -> bool:
        """`uid` takes `milli` of `gpu`; True when the GPU held no share before (the caller
        then holds it whole in its ledger under `holder`, which this remembers)."""
        if uid in self._held:
            raise ShareError(f"pod {uid} already holds a share")
        if not 0 < milli < MILLI_PER_GPU:
            raise ShareError(f"a share is 1..999 milli-GPUs, got {milli}")
        on_node = self._used.setdefault(node, {})
        before = on_node.get(gpu, 0)
        if before + milli > MILLI_PER_GPU:
            raise ShareError(f"GPU {gpu} on {node} holds {before} milli: {milli} more would "
                             f"exceed {MILLI_PER_GPU}")
        on_node[gpu] = before + milli
        self._held[uid] = Share(node, gpu, milli)
        if before == 0:
            self._holders[node, gpu] = holder
        return before == 0

    def release(self, uid: str) -> tuple[Share, str | None] | None:
        """Free exactly what `uid` held: its share, and the stand-in holder's name when the
        GPU holds no share any more (the caller frees it in its ledger). None when `uid`
        held no share."""
        share = self._held.pop(uid, None)
        if share is None:
            return None
        on_node = self._used[share.node]
        on_node[share.gpu] -= share.milli
        if on_node[share.gpu]:
            return share, None
        del on_node[share.gpu]
        return share, self._holders.pop((share.node, share.gpu))
