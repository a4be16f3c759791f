"""An allocator that always searches where `Allocator` proves an answer without a search:
the reference the differential rail tests compare with (docs/decisions/0096, "Update")."""

from __future__ import annotations

from railyard.allocation.allocator import Allocator


class SearchingEmpty(Allocator):
    """The allocator without the proofs that spare the empty node's search with the
    sequence (`_empty_with_rails`, `_no_worse_than_empty`,
    `_as_good_as_empty_without_rails`): what it did before them."""

    def _empty_with_rails(self, *args: object) -> tuple | None:
        return None

    def _no_worse_than_empty(self, *args: object) -> bool:
        return False

    def _as_good_as_empty_without_rails(self, *args: object) -> bool:
        return False
