"""Which job a pod belongs to (docs/rails.md): Railyard's label first, then JobSet,
LeaderWorkerSet (one job per group) and PodGroup labels; and a job's rail sequence from its
bound pods' records."""

from __future__ import annotations

import pytest

from railyard.allocation.jobs import (
    JOB_LABEL,
    JOBSET_LABEL,
    LEGACY_POD_GROUP_LABEL,
    LWS_GROUP_LABEL,
    LWS_LABEL,
    POD_GROUP_LABEL,
    job_of,
    job_rails,
)


@pytest.mark.parametrize("labels, job", [
    ({JOB_LABEL: "a", JOBSET_LABEL: "b"}, "ml/job:a"),
    ({JOBSET_LABEL: "llama", "app": "x"}, "ml/jobset:llama"),
    ({LWS_LABEL: "vllm", LWS_GROUP_LABEL: "2"}, "ml/lws:vllm/2"),
    ({LWS_LABEL: "vllm"}, "ml/lws:vllm"),
    ({POD_GROUP_LABEL: "g"}, "ml/podgroup:g"),
    ({LEGACY_POD_GROUP_LABEL: "g"}, "ml/podgroup:g"),
    ({"app": "x"}, None),
    ({JOB_LABEL: ""}, None),
    ({JOB_LABEL: 3}, None),
    ({JOB_LABEL: "x" * 64}, None),
    (None, None),
    ("not-a-map", None),
])
def test_job_of_reads_the_documented_labels(labels, job):
    assert job_of("ml", labels) == job


def test_job_rails_is_the_most_used_rail_per_pair_index():
    assert job_rails([]) == ()
    assert job_rails([(2, 3), (2, 3), (4, 5)]) == (2, 3)
    assert job_rails([(2, 3, None), (4,)]) == (2, 3, None)
    assert job_rails([(5, None), (1, None)]) == (1, None)  # a tie: the lowest rail
