"""The agent tests share the fake kubelet and harness that live in tests/kubelet."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kubelet"))
