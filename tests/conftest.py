"""Fixtures every test area may use.

Living in `tests/`, this file is why `support` (tests/support/, the shared helpers) imports
from any test: pytest's default "prepend" import mode puts the folder of a conftest.py that is
not inside a package on the import path.
"""

from __future__ import annotations

import pytest

from support.agent import make_tree


@pytest.fixture(scope="session")
def generic_tree(tmp_path_factory):
    """A read-only generic node: 2 GPUs, 2 RoCE PFs with 4 VFs each (written once: the writer
    is not free)."""
    return make_tree(tmp_path_factory.mktemp("generic") / "root")
