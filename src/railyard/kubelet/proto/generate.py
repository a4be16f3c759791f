"""Regenerate `railyard/kubelet/api/` from the .proto files beside this script.

Run from the repository root:  python src/railyard/kubelet/proto/generate.py
(needs grpcio-tools, a test extra). The protos are copied under a `railyard/kubelet/api/`
include path so that the generated `_grpc` modules import their `_pb2` siblings by their
package path instead of as top-level modules.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[2]  # .../src
PROTOS = ("deviceplugin.proto", "dra.proto", "dra_health.proto", "pluginregistration.proto",
          "podresources.proto")


def main() -> int:
    out = SRC / "railyard" / "kubelet" / "api"
    with tempfile.TemporaryDirectory() as tmp:
        inc = Path(tmp) / "railyard" / "kubelet" / "api"
        inc.mkdir(parents=True)
        for p in PROTOS:
            shutil.copy(HERE / p, inc / p)
        args = ["protoc", f"-I{tmp}", f"--python_out={SRC}", f"--pyi_out={SRC}",
                f"--grpc_python_out={SRC}", *(str(inc / p) for p in PROTOS)]
        if protoc.main(args) != 0:
            print("protoc failed", file=sys.stderr)
            return 1
    (out / "__init__.py").write_text('"""Generated from ../proto by proto/generate.py; '
                                     'do not edit."""\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
