"""A distance class that is not one is refused, quoting at most 40 characters of it (the fuzz
sweep: a NodeTopology naming a 70,000-character class gave a 70,000-character error)."""

from __future__ import annotations

import pytest

from railyard.topology.model import Distance


def test_a_long_unknown_class_is_quoted_short():
    with pytest.raises(ValueError) as e:
        Distance.parse("x" * 70_000)
    assert len(str(e.value)) < 200 and "(70000 characters)" in str(e.value)


def test_a_short_unknown_class_is_quoted_whole_and_a_known_one_parses():
    with pytest.raises(ValueError, match=r"unknown distance class 'PIXX': expected PIX\|"):
        Distance.parse("PIXX")
    assert Distance.parse("pxb") is Distance.PXB
