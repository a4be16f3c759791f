"""Which job a pod belongs to, from its labels, and the rail sequence a job's pods hold.

Pods of one job get one rail sequence (docs/rails.md): pair i of every pod on rail r_i. A
job is named by Railyard's own label or by the labels the common job controllers put on
their pods; the first one present wins, in this order:

- `railyard.dev/job`: any value; pods with the same value (in one namespace) are one job;
- JobSet: `jobset.sigs.k8s.io/jobset-name` (every replicated job of the JobSet is one job);
- LeaderWorkerSet: `leaderworkerset.sigs.k8s.io/name` with `…/group-index`: each group (a
  leader and its workers, one model replica) is one job;
- PodGroup (scheduler-plugins coscheduling): `scheduling.x-k8s.io/pod-group`, or the older
  lightweight coscheduling's `pod-group.scheduling.sigs.k8s.io/name`.

Pure: no I/O; the extender calls `job_of` on the pods kube-scheduler sends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

JOB_LABEL = "railyard.dev/job"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
LWS_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
LEGACY_POD_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io/name"

# (label, the job kind it names), in the order they are tried.
_JOB_LABELS = ((JOB_LABEL, "job"), (JOBSET_LABEL, "jobset"), (LWS_LABEL, "lws"),
               (POD_GROUP_LABEL, "podgroup"), (LEGACY_POD_GROUP_LABEL, "podgroup"))
MAX_LABEL_VALUE = 63  # Kubernetes' limit on a label value; longer is not a label we trust


def job_of(namespace: str, labels: Any) -> str | None:
    """The pod's job as `namespace/kind:name` (LeaderWorkerSet: `…:name/group`), or None
    when no job label is set. Non-string or oversized values are ignored, never an error:
    a job label only ever adds a preference (or, asked for, a constraint) to a pod."""
    if not isinstance(labels, Mapping):
        return None
    for label, kind in _JOB_LABELS:
        value = labels.get(label)
        if isinstance(value, str) and 0 < len(value) <= MAX_LABEL_VALUE:
            if kind == "lws":
                group = labels.get(LWS_GROUP_LABEL)
                if isinstance(group, str) and 0 < len(group) <= MAX_LABEL_VALUE:
                    value = f"{value}/{group}"
            return f"{namespace}/{kind}:{value}"
    return None


def job_rails(held: Iterable[tuple[int | None, ...]]) -> tuple[int | None, ...]:
    """The rail sequence of a job from the sequences its bound pods hold: per pair index, the
    rail most of them use there (the lowest among equals; None where none knows a rail).
    Under `rails: required` they all agree; under `preferred` a pod that could not keep the
    sequence does not move it."""
    counts: list[Counter[int]] = []
    for rails in held:
        for i, rail in enumerate(rails):
            while len(counts) <= i:
                counts.append(Counter())
            if rail is not None:
                counts[i][rail] += 1
    return tuple(min(c, key=lambda r: (-c[r], r)) if c else None for c in counts)
