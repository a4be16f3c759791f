"""The end-to-end test reuses the other areas' helpers: the fake kubelet (tests/kubelet), the
throwaway-namespace tools and the CNI shim caller (tests/cni), and scheduler pods
(tests/scheduler). Their module names are unique, so putting the folders on sys.path is
enough; nothing is copied."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent
for area in ("kubelet", "cni", "scheduler"):
    if str(_TESTS / area) not in sys.path:
        sys.path.insert(0, str(_TESTS / area))
