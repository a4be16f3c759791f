"""Trace loading: the shipped openb lists, custom CSVs, and precise errors for bad rows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.sim.trace import BUILTIN_TRACES, TraceError, load_trace, parse_trace

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"


def test_builtin_default_trace_matches_the_published_counts():
    trace = load_trace("openb-default")
    assert len(trace.pods) == 8152
    assert trace.has_times
    assert sum(1 for p in trace.pods if p.gpus == 0) == 1088
    assert sum(1 for p in trace.pods if p.gpus >= 2) == 75
    assert sum(1 for p in trace.pods if p.is_fractional) == 3078


def test_builtin_multigpu20_trace_has_no_times_and_more_multi_gpu_pods():
    trace = load_trace("openb-multigpu20")
    assert not trace.has_times
    assert sum(1 for p in trace.pods if p.gpus >= 2) == 247


def test_every_builtin_trace_loads():
    for name in BUILTIN_TRACES:
        assert load_trace(name).gpu_pods


def test_custom_csv_file_loads(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(f"{HEADER}\np0,1000,1024,2,1000\np1,500,512,1,300\n")
    trace = load_trace(str(f))
    assert trace.name == str(f)
    assert [p.gpus for p in trace.pods] == [2, 1]
    assert trace.pods[1].is_fractional and not trace.pods[0].is_fractional


def test_unknown_trace_name_lists_the_builtin_ones():
    with pytest.raises(TraceError, match="openb-default"):
        load_trace("no-such-trace")


def test_missing_column_is_named():
    with pytest.raises(TraceError, match=r"missing column.*num_gpu"):
        parse_trace("name,cpu_milli,memory_mib,gpu_milli\np,1,1,1000\n", "t")


def test_bad_number_names_line_and_column():
    with pytest.raises(TraceError, match=r"line 3, column num_gpu: not a number: 'two'"):
        parse_trace(f"{HEADER}\np,1,1,1,1000\nq,1,1,two,1000\n", "t")


def test_negative_and_too_large_values_are_rejected():
    with pytest.raises(TraceError, match="column cpu_milli: -5 out of range"):
        parse_trace(f"{HEADER}\np,-5,1,1,1000\n", "t")
    with pytest.raises(TraceError, match="column gpu_milli: 1500 out of range"):
        parse_trace(f"{HEADER}\np,1,1,1,1500\n", "t")


def test_fractional_multi_gpu_pod_is_rejected():
    with pytest.raises(TraceError, match="2-GPU pod cannot use a fraction"):
        parse_trace(f"{HEADER}\np,1,1,2,500\n", "t")


def test_integral_floats_are_accepted_and_fractions_are_not():
    trace = parse_trace(f"{HEADER}\np,1000.0,1,1.0,1000\n", "t")
    assert trace.pods[0].gpus == 1
    with pytest.raises(TraceError, match="whole number"):
        parse_trace(f"{HEADER}\np,1,1,1.5,1000\n", "t")


def test_trace_without_gpu_pods_is_rejected():
    with pytest.raises(TraceError, match="no pod asks for a GPU"):
        parse_trace(f"{HEADER}\np,1,1,0,0\n", "t")


def test_extra_cells_are_reported():
    with pytest.raises(TraceError, match="line 2: 6 cells"):
        parse_trace(f"{HEADER}\np,1,1,1,1000,9\n", "t")


def test_trace_error_names_the_physical_line_after_blank_lines():
    text = f"{HEADER}\na,1,1,1,1000\n\n\n\nb,1,1,x,1000\n"
    with pytest.raises(TraceError, match=r"line 6, column num_gpu"):
        parse_trace(text, "t.csv")


def test_trace_error_names_the_physical_line_after_a_quoted_multiline_cell():
    text = f'{HEADER}\n"pod\nwith newline",1,1,1,1000\nc,1,1,x,1000\n'
    with pytest.raises(TraceError, match=r"line 4, column num_gpu"):
        parse_trace(text, "t.csv")


def test_trace_error_in_a_multiline_row_names_its_first_and_last_lines():
    text = f'{HEADER}\nc,1,1,1,1000\n"pod\nwith newline",1,1,x,1000\n'
    with pytest.raises(TraceError, match=r"lines 3-4, column num_gpu"):
        parse_trace(text, "t.csv")


def test_trace_with_a_utf8_bom_is_read(tmp_path):
    """Spreadsheets write "CSV UTF-8" with a byte-order mark; the header is otherwise fine."""
    f = tmp_path / "t.csv"
    f.write_bytes(("\ufeff" + f"{HEADER}\np0,1000,1024,1,1000\n").encode("utf-8"))
    trace = load_trace(str(f))
    assert [p.gpus for p in trace.pods] == [1]


def test_trace_with_a_duplicated_column_is_an_error():
    """Two num_gpu columns: which one counts is a guess (csv keeps the last, silently)."""
    text = f"{HEADER},num_gpu\np0,1,1,1,1000,8\n"
    with pytest.raises(TraceError, match=r"column\(s\) num_gpu appear more than once"):
        parse_trace(text, "t.csv")


def test_numbers_are_plain_digits():
    """int() would read "1_0" as 10 and Arabic-Indic digits as numbers."""
    for cell in ("1_0", "1_000.0", "\u0661"):
        with pytest.raises(TraceError, match=f"column cpu_milli: not a number: {cell!r}"):
            parse_trace(f"{HEADER}\np,{cell},1,1,1000\n", "t")


def test_a_number_too_large_is_out_of_range_and_not_echoed_whole():
    for cell in ("9" * 5000, "9" * 5000 + ".0", "1e30", str(2**63)):
        with pytest.raises(TraceError, match=r"line 2, column cpu_milli: .* out of range") as e:
            parse_trace(f"{HEADER}\np,{cell},1,1,1000\n", "t")
        assert len(str(e.value)) < 150
    assert parse_trace(f"{HEADER}\np,{2**63 - 1},1,1,1000\n", "t").pods[0].cpu_milli == 2**63 - 1


def test_a_cell_over_the_csv_field_limit_names_its_line():
    text = f"{HEADER}\np,1,1,1,1000\n\nq,1,1,1,{'9' * 200_000}\n"
    with pytest.raises(TraceError, match=r"line 4: not CSV: field larger than field limit"):
        parse_trace(text, "t")


def test_creation_time_column_gives_times():
    trace = parse_trace(f"{HEADER},creation_time\np,1,1,1,1000,30\nq,1,1,1,1000,10\n", "t")
    assert trace.has_times
    assert [p.creation_time for p in trace.pods] == [30, 10]


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 8),
                          st.integers(0, 1000)), min_size=1, max_size=20))
def test_parse_roundtrips_valid_rows(rows):
    rows = [(c, m, g, 1000 if g > 1 else milli) for c, m, g, milli in rows]
    text = HEADER + "\n" + "".join(f"p{i},{c},{m},{g},{milli}\n"
                                   for i, (c, m, g, milli) in enumerate(rows))
    if not any(g for _, _, g, _ in rows):
        with pytest.raises(TraceError):
            parse_trace(text, "t")
        return
    trace = parse_trace(text, "t")
    assert [(p.cpu_milli, p.memory_mib, p.num_gpu) for p in trace.pods] == [
        (c, m, g) for c, m, g, _ in rows]


@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_trace_errors(text):
    try:
        trace = parse_trace(HEADER + "\n" + text, "t")
    except TraceError as e:
        assert str(e).startswith("trace t")
    else:
        assert any(p.gpus for p in trace.pods)
