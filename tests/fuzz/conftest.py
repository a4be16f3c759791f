"""The fuzz sweep's hypothesis profile: every parser a pod, a network config, a runtime or
kube-scheduler can reach, held to "a precise error, no state change, bounded cost" (issue 19).

The profile is registered here and applied per test (`@FUZZ` from `fuzz_strategies`), never
loaded globally: the rest of the suite keeps its own settings. Reproducible in CI
(derandomize: the same examples every run, no example database); sized so the whole of
`tests/fuzz` runs in about a minute on the 2-CPU development VM (docs/testing.md). Run it
longer by hand with `RAILYARD_FUZZ_EXAMPLES=5000 python3 -m pytest tests/fuzz` and, to draw
other examples than CI does on each run, `RAILYARD_FUZZ_RANDOM=1`.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

DEFAULT_EXAMPLES = 300

settings.register_profile(
    "railyard-fuzz",
    max_examples=int(os.environ.get("RAILYARD_FUZZ_EXAMPLES", DEFAULT_EXAMPLES)),
    # Each call is timed by the test itself (fuzz_strategies.TIME_S), against a bound that
    # says what a user would notice; hypothesis' own deadline would flake on a loaded runner.
    deadline=None,
    derandomize=not os.environ.get("RAILYARD_FUZZ_RANDOM"),
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much, HealthCheck.large_base_example,
                           HealthCheck.function_scoped_fixture],
)
