"""Kernel CPU lists: parsing and formatting are inverse, and bad input names the element."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.topology.cpus import MAX_CPU, cpu_ranges, format_cpulist, parse_cpulist

cpu_sets = st.sets(st.integers(min_value=0, max_value=1023), max_size=300)


@given(cpu_sets)
def test_formatting_then_parsing_gives_back_the_set(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == sorted(cpus)


@given(cpu_sets)
def test_formatted_list_is_canonical(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert format_cpulist(parse_cpulist(text)) == text


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 40)), max_size=20))
def test_any_kernel_style_list_parses_to_its_cpus(ranges: list[tuple[int, int]]) -> None:
    parts = [f"{lo}-{lo + n}" if n else str(lo) for lo, n in ranges]
    expected = sorted({c for lo, n in ranges for c in range(lo, lo + n + 1)})
    assert parse_cpulist(",".join(parts) + "\n") == expected


def test_real_shapes() -> None:
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    assert format_cpulist(list(range(56)) + list(range(112, 168))) == "0-55,112-167"


@pytest.mark.parametrize("bad", ["x", "3-1", "1-", "-1", "1,,2", "0-a", "1_0", "+3", "0-9_9999",
                                 "\uff10-\uff13", "\u00b2", "0-65536", "0-4000000000", "1" * 5000])
def test_bad_element_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match="bad CPU list element"):
        parse_cpulist(bad)


def test_the_largest_cpu_id_is_max_cpu() -> None:
    # Records are user-editable: ids past MAX_CPU are refused before a range is expanded.
    assert parse_cpulist(f"{MAX_CPU}") == [MAX_CPU]
    with pytest.raises(ValueError, match=f"CPU ids end at {MAX_CPU}"):
        parse_cpulist(f"0-{MAX_CPU + 1}")


def test_repeated_ranges_cost_what_the_cpus_cost_not_what_the_text_says() -> None:
    # Issue 19, class 1: 4 KB of "0-65535," (an Allocation record's `cpus`) expanded every
    # range before de-duplicating: 33 million ids, 1.3 GB and 4 s in the agent. Ranges are
    # merged first, so the ids listed are at most MAX_CPU + 1, whatever the text repeats.
    text = ",".join([f"0-{MAX_CPU}"] * 100)
    tracemalloc.start()
    try:
        started = time.perf_counter()
        cpus = parse_cpulist(text)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cpus == list(range(MAX_CPU + 1))
    assert peak < 16 << 20, f"peak {peak >> 20} MiB"
    assert elapsed < 2.0, f"{elapsed:.2f} s"


def test_overlapping_and_unordered_ranges_mean_their_union() -> None:
    assert parse_cpulist("8-11,0-3,2-9,3") == list(range(12))
    assert cpu_ranges("8-11,0-3,2-9,3") == [(8, 11), (0, 3), (2, 9), (3, 3)]
