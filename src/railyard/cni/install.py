"""Install the shim into a CNI bin folder, with the interpreter it must run under.

The shim is stdlib-only, so the installed file is the shim's own source with a shebang naming
an interpreter and `-IS` (isolated: no PYTHON* variables, no user site; no site-packages: ~20 ms
less per call). Standalone mode loads site-packages itself, so the interpreter must be one
where railyard is installed (the default: the one running this); agent mode needs only a
python3 on the host (`--interpreter /usr/bin/python3`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import railyard.cni.shim as shim_module

SHIM_NAME = "railyard-cni"


def shim_source(interpreter: str) -> str:
    if not os.path.isabs(interpreter) or any(c.isspace() for c in interpreter):
        raise ValueError(f"interpreter must be an absolute path without spaces: {interpreter!r}")
    body = Path(shim_module.__file__).read_text(encoding="utf-8")
    return f"#!{interpreter} -IS\n{body}"


def install_shim(bin_dir: str | os.PathLike[str], interpreter: str | None = None) -> Path:
    """Write `<bin_dir>/railyard-cni` atomically (a runtime may be executing the old one)."""
    target = Path(bin_dir) / SHIM_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{SHIM_NAME}.{os.getpid()}.tmp")
    tmp.write_text(shim_source(interpreter or sys.executable), encoding="utf-8")
    tmp.chmod(0o755)
    os.replace(tmp, target)
    return target
