"""Fixtures every test area may use.

Living in `tests/`, this file is why `support` (tests/support/, the shared helpers) imports
from any test: pytest's default "prepend" import mode puts the folder of a conftest.py that is
not inside a package on the import path.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from support.agent import make_tree

# Every property test of the suite: no per-example deadline (hypothesis' 200 ms default
# fails a run when a loaded runner is slow, which says nothing of the code; a test that
# bounds time times itself), and a failure prints the blob that replays it
# (`@reproduce_failure`), since CI draws new examples on every run. Tests and the fuzz
# profile set their own example counts on top of it.
settings.register_profile("railyard", deadline=None, print_blob=True)
settings.load_profile("railyard")


@pytest.fixture(scope="session")
def generic_tree(tmp_path_factory):
    """A read-only generic node: 2 GPUs, 2 RoCE PFs with 4 VFs each (written once: the writer
    is not free)."""
    return make_tree(tmp_path_factory.mktemp("generic") / "root")
