"""Install the shim into a CNI bin folder, with the interpreter it must run under.

The shim is stdlib-only, so it is installed as a copy of `shim.py` in `<bin_dir>/.railyard-cni/`
(byte-compiled there), plus a three-line launcher `<bin_dir>/railyard-cni` whose shebang names
an interpreter and `-IS` (isolated: no PYTHON* variables, no user site; no site-packages, ~20 ms
less per call). A script run directly is compiled on every start (6 ms on the loaded VM); a
module imported from its folder uses the cached bytecode. Standalone mode loads site-packages
itself, so the interpreter must be one where railyard is installed (the default: the one
running this); agent mode needs only a python3 on the host (`--interpreter /usr/bin/python3`).
"""

from __future__ import annotations

import os
import py_compile
import sys
from pathlib import Path

import railyard.cni.shim as shim_module
from railyard.node.files import write_atomic

SHIM_NAME = "railyard-cni"
MODULE_DIR = ".railyard-cni"
MODULE = "railyard_cni_shim"


def launcher_source(interpreter: str, module_dir: Path) -> str:
    if not os.path.isabs(interpreter) or any(c.isspace() for c in interpreter):
        raise ValueError(f"interpreter must be an absolute path without spaces: {interpreter!r}")
    return (f"#!{interpreter} -IS\n"
            f"import sys\n"
            f"sys.path.insert(0, {str(module_dir)!r})\n"
            f"from {MODULE} import main\n"
            f"main()\n")


def _replace(path: Path, text: str, mode: int) -> None:
    """Write next to the target, then rename: a runtime may be executing the old file."""
    write_atomic(path, text.encode("utf-8"), mode=mode)


def install_shim(bin_dir: str | os.PathLike[str], interpreter: str | None = None) -> Path:
    """Install (or update) `<bin_dir>/railyard-cni`; returns the launcher's path."""
    bin_path = Path(bin_dir)
    module_dir = bin_path / MODULE_DIR
    module_dir.mkdir(parents=True, exist_ok=True)
    module = module_dir / f"{MODULE}.py"
    _replace(module, Path(shim_module.__file__).read_text(encoding="utf-8"), 0o644)
    py_compile.compile(str(module), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    target = bin_path / SHIM_NAME
    _replace(target, launcher_source(interpreter or sys.executable, module_dir.resolve()), 0o755)
    return target
