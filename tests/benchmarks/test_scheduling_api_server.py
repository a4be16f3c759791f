"""benchmarks/scheduling.py's reading of the API server's /metrics over a round: a Binding's
handling summed over the label sets the API server splits it into, and APF's queue wait by
priority level, counted only for what the round added."""

from __future__ import annotations

import math

from scheduling import binding_in_api_server


def sample(name: str, value: int, **labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}} {value}"


def exposition(bindings_fast: int, bindings_slow: int, waited: int) -> str:
    """Two label sets of POST pods/binding (as the API server splits by scope and
    component), one of another request, and one priority level's wait histogram."""
    duration = "apiserver_request_duration_seconds_bucket"
    wait = "apiserver_flowcontrol_request_wait_duration_seconds"
    binding = {"resource": "pods", "subresource": "binding", "verb": "POST",
               "scope": "resource", "version": "v1", "group": "", "dry_run": ""}
    lines = []
    for component, count in (("apiserver", bindings_fast), ("other", bindings_slow)):
        fast = count if component == "apiserver" else 0
        for le, n in (("0.05", fast), ("1", count), ("+Inf", count)):
            lines.append(sample(duration, n, component=component, le=le, **binding))
    lines.append(sample(duration, 999, le="+Inf", resource="pods", subresource="",
                        verb="POST"))
    level = {"flow_schema": "global-default", "priority_level": "global-default"}
    for execute, n in (("true", waited), ("false", 7)):
        for le, c in (("0.001", 0), ("2", n), ("+Inf", n)):
            lines.append(sample(f"{wait}_bucket", c, execute=execute, le=le, **level))
        lines.append(sample(f"{wait}_count", n, execute=execute, **level))
    return "\n".join(lines) + "\n"


def test_only_what_the_round_added_counts_summed_over_label_sets():
    before = exposition(bindings_fast=100, bindings_slow=0, waited=5)
    after = exposition(bindings_fast=100, bindings_slow=100, waited=105)
    view = binding_in_api_server(before, after)
    # The round added 100 Bindings, all in (0.05, 1] s: the 100 fast ones from before do
    # not pull its median below 0.05 s.
    assert 50 < view["bindingP50Ms"] <= 1000
    assert view["global-defaultRequests"] == 100  # executed only; the 7 rejected not counted
    assert 1 < view["global-defaultWaitP99Ms"] <= 2000


def test_a_round_with_no_binding_says_nothing_of_them():
    same = exposition(bindings_fast=3, bindings_slow=0, waited=0)
    view = binding_in_api_server(same, same)
    assert "bindingP99Ms" not in view and "global-defaultRequests" not in view
    assert not any(isinstance(v, float) and math.isnan(v) for v in view.values())
