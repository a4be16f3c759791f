"""Helpers shared by the test areas, importable as `support.<module>` from any test.

pytest puts `tests/` on the import path because `tests/conftest.py` lives there (its
default "prepend" import mode); no test edits `sys.path` itself.

- `pods`: the one v1 Pod builder; `allocations`: the one Allocation builder.
- `agent`: fixture sysfs trees and a running agent beside `fake_kubelet`.
- `cni`: a throwaway node in a network namespace, and the CNI shim caller.
- `without`: Python in a subprocess with some packages unimportable (a missing extra).
"""
