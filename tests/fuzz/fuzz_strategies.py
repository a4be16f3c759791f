"""Hostile input for the fuzz sweep, and the three checks every entry point is held to.

Input comes two ways: `mutated(valid)` takes a valid document and changes one to three places
in it (a value of the wrong type, a huge, negative, fractional or boolean number, deep
nesting, a long string, a trailing newline, non-ASCII, a key dropped or added, a list grown),
so that most examples get past the first checks; `raw_text`/`raw_bytes` are the JSON text of
such a document cut, spliced or corrupted, and plain random bytes.

The checks (`call`): the entry point returns, or raises exactly its documented error with a
non-empty, bounded message that names a field or says what was expected; within `TIME_S`;
and, where asked, within a `tracemalloc` peak.
"""

from __future__ import annotations

import copy
import json
import re
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from hypothesis import event, note, settings
from hypothesis import strategies as st

# The sweep's settings (registered in this folder's conftest.py), for each test: `@FUZZ`.
FUZZ = settings.get_profile("railyard-fuzz")

# Generous on purpose: one call of any parser here takes well under 50 ms; a CI machine with
# two loaded cores must not flake, and a cost blow-up (the 4 s, 2.5 GB annotation of issue 19)
# is far past it.
TIME_S = 1.0
# An error message is read by a person (a log line, an Event, kube-scheduler's Error): it
# names the field and what was wrong, and never echoes a whole hostile value back.
MAX_MESSAGE_CHARS = 2000

# ----------------------------------------------------------------------- deep nesting

# A placeholder string for "nested `depth` levels here": `materialise` turns it into nested
# Python lists or objects (built without recursion), `to_json` into "[[[…]]]" text, so
# neither the test's own json.dumps nor its walks recurse into it.
_DEEP = re.compile(r"⟪deep:(list|dict):([0-9]+)⟫")
DEPTHS = (2, 40, 65, 200, 900, 990, 1_100, 5_000, 100_000)


def _deep_marker(kind: str, depth: int) -> str:
    return f"⟪deep:{kind}:{depth}⟫"


def _nested(kind: str, depth: int) -> Any:
    value: Any = [] if kind == "list" else {}
    for _ in range(depth - 1):
        value = [value] if kind == "list" else {"a": value}
    return value


def _nested_text(kind: str, depth: int) -> str:
    return ("[" * depth + "]" * depth if kind == "list"
            else '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1))


def materialise(doc: Any) -> Any:
    """The document as Python values, each deep marker made the nesting it stands for."""
    if isinstance(doc, str):
        m = _DEEP.fullmatch(doc)
        return _nested(m[1], int(m[2])) if m else doc
    if isinstance(doc, list):
        return [materialise(v) for v in doc]
    if isinstance(doc, dict):
        return {k: materialise(v) for k, v in doc.items()}
    return doc


def to_json(doc: Any) -> str:
    """The document's JSON text (NaN and Infinity as Python writes them: a JSON parser that
    accepts them is fed them), deep markers written out as nesting."""
    text = json.dumps(doc, ensure_ascii=False)
    return re.sub(r'"⟪deep:(list|dict):([0-9]+)⟫"',
                  lambda m: _nested_text(m[1], int(m[2])), text)


# ----------------------------------------------------------------------- hostile values

HUGE_INTS = (2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**4300 - 1,
             -(10**400))
ODD_TEXT = (
    "", " ", "\n", "0\n", "1\n", " 1", "1 ", "\t2", "\x00", "2\x00", "\u2028", "1\u2028",
    "٣", "１", "²", "1_0", "+3", "-1", "0x10", "1e999", "1e-999", "NaN", "Infinity", "-0",
    "0.5", "1.0", "1/2", "100m", "64Gi", "1Ki\n", "1e64", "1e65", "9" * 70, "é", "💥",
    "\udcff", "\ud800", "0-65535", "65536", "0000:00:01.0\n", "default", "Always", "PIX",
    "SYS\n", "single", "one-to-one", "scheduler", "1.0.0", "ADD",
)
hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(HUGE_INTS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ODD_TEXT),
    st.text(max_size=24),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8),
    st.sampled_from((1_000, 70_000, 300_000)).map(lambda n: "x" * n),
    st.sampled_from(DEPTHS).flatmap(
        lambda d: st.sampled_from(("list", "dict")).map(lambda k: _deep_marker(k, d))),
)
hostile_values = st.one_of(
    hostile_scalars,
    st.lists(hostile_scalars, max_size=3),
    st.dictionaries(st.text(max_size=8), hostile_scalars, max_size=3),
)


def _paths(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of the document, the top excluded."""
    out: list[tuple[Any, Any]] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        keys = (range(len(node)) if isinstance(node, list)
                else list(node) if isinstance(node, dict) else ())
        for k in keys:
            out.append((node, k))
            if isinstance(node[k], list | dict):
                stack.append(node[k])
    return out


def _containers(doc: Any) -> list[Any]:
    found = [doc] if isinstance(doc, list | dict) else []
    found += [c[k] for c, k in _paths(doc) if isinstance(c[k], list | dict)]
    return found


@st.composite
def _mutate_once(draw: st.DrawFn, doc: Any) -> Any:
    """One hostile change in place (on a copy the caller owns); returns the new top."""
    paths = _paths(doc)
    how = draw(st.sampled_from(("replace", "replace", "replace", "number", "string", "drop",
                                "add", "grow", "wrap", "top")))
    if how == "top" or not paths:
        return draw(hostile_values)
    parent, key = draw(st.sampled_from(paths))
    value = parent[key]
    if how == "number" and type(value) is int:
        # An int grown past a float's range (an earlier "number" draw) becomes infinity, which
        # json.dumps writes as `Infinity`: hostile too, and no OverflowError in the strategy.
        # Python writes and reads ints of at most 4,300 digits (sys.int_info): past that the
        # harness could not encode the document, so grown ints stop short of it.
        near = float(value) if abs(value) < 2**1023 else float("inf")
        grown = [v for v in (value + 1, value - 1, -value - 1, value * 10**20)
                 if v.bit_length() < 14_000]
        parent[key] = draw(st.sampled_from((
            *grown, near + 0.5, near, *([str(value), f"{value}\n"] if grown else []),
            bool(value), -(2**63), 2**63, 10**4300 - 1)))
    elif how == "string" and isinstance(value, str):
        # Repeated only while short: a 300,000-character value repeated would be the test's
        # own memory blow-up, not the parser's.
        parent[key] = draw(st.sampled_from((
            value + "\n", "\n" + value, value + " ", value + "\x00", value.upper(),
            value + "é", value + "\u2028", value * (1000 if len(value) <= 100 else 1),
            value[:-1], "")))
    elif how == "drop" and isinstance(parent, dict):
        del parent[key]
    elif how == "add":
        target = draw(st.sampled_from(_containers(doc)))
        extra = draw(hostile_values)
        if isinstance(target, dict):
            name = draw(st.text(max_size=12) | st.sampled_from(sorted(
                {k for c, k in paths if isinstance(c, dict)})))
            target[name] = extra
        else:
            target.append(extra)
    elif how == "grow" and isinstance(value, list) and 0 < len(value) <= 2 \
            and len(paths) <= 5_000:
        # Grown once, to at most 200,000 values and 2 MB of JSON: the copies share their
        # items, so a long string or a list grown inside a grown list would be gigabytes for
        # the test itself to write out.
        times = draw(st.sampled_from((2, 100, 5_000)))
        times = max(1, min(times, 200_000 // (len(_paths(value)) + len(value)),
                           2_000_000 // len(to_json(value))))
        # Copies, not the same items again: a later change to one must not be made to all.
        parent[key] = [copy.deepcopy(item) for _ in range(times) for item in value]
    elif how == "wrap":
        parent[key] = draw(st.sampled_from(([value], {"value": value}, [value, value])))
    else:
        parent[key] = draw(hostile_values)
    return doc


@st.composite
def mutated(draw: st.DrawFn, valid: Any, at_most: int = 3) -> Any:
    """`valid` (a JSON document; left alone) with one to `at_most` hostile changes."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, at_most))):
        doc = draw(_mutate_once(doc))
    return doc


def documents(valid: Any) -> st.SearchStrategy[Any]:
    """Mostly mutations of `valid`, sometimes `valid` itself or any hostile value; deep
    markers left in (for `to_json`; `materialise` them for a Python value)."""
    return st.one_of(mutated(valid), mutated(valid), st.just(valid), hostile_values)


def values(valid: Any) -> st.SearchStrategy[Any]:
    """`documents(valid)` as Python values, deep markers materialised."""
    return documents(valid).map(materialise)


@st.composite
def raw_text(draw: st.DrawFn, valid: Any) -> str:
    """JSON text of a mutation of `valid`, sometimes damaged as text: cut short, a character
    inserted or replaced, a key written twice, a huge number, a byte-order mark, trailing
    garbage or a trailing newline."""
    text = to_json(draw(st.one_of(mutated(valid), st.just(valid))))
    how = draw(st.sampled_from(("as is", "as is", "cut", "insert", "replace", "twice",
                                "digits", "bom", "trail", "newline")))
    i = draw(st.integers(0, len(text)))
    if how == "cut":
        text = text[:i]
    elif how == "insert":
        text = text[:i] + draw(st.text(min_size=1, max_size=4)) + text[i:]
    elif how == "replace" and text:
        i = min(i, len(text) - 1)
        text = text[:i] + draw(st.characters()) + text[i + 1:]
    elif how == "twice" and text.startswith("{") and len(text) > 2:
        j = text.find(",") if "," in text else len(text) - 1
        text = "{" + text[1:j] + "," + text[1:]
    elif how == "digits":
        text = text[:i] + "1" * draw(st.sampled_from((20, 4_400, 10_000))) + text[i:]
    elif how == "bom":
        text = "\ufeff" + text
    elif how == "trail":
        text += draw(st.sampled_from(("}", "]", ",", " x", "\x00", "{}", "NaN")))
    elif how == "newline":
        text += "\n"
    return text


def raw_bytes(valid: Any) -> st.SearchStrategy[bytes]:
    """Bytes: the UTF-8 of `raw_text`, that with invalid UTF-8 spliced in, or any bytes."""
    def splice(text: str, junk: bytes, at: float) -> bytes:
        data = text.encode("utf-8", "surrogatepass")
        i = int(len(data) * at)
        return data[:i] + junk + data[i:]

    return st.one_of(
        raw_text(valid).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.builds(splice, raw_text(valid),
                  st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\xef\xbb\xbf")),
                  st.floats(0, 1)),
        st.binary(max_size=300),
    )


# ----------------------------------------------------------------------- the checks


class Outcome:
    """What one call did: its value or its (allowed) error, how long it took, its peak."""

    __slots__ = ("error", "peak_bytes", "seconds", "value")

    def __init__(self, value: Any, error: BaseException | None, seconds: float,
                 peak_bytes: int | None) -> None:
        self.value = value
        self.error = error
        self.seconds = seconds
        self.peak_bytes = peak_bytes

    @property
    def refused(self) -> bool:
        return self.error is not None


def call(fn: Callable[[], Any], allowed: type[BaseException] | tuple[type[BaseException], ...],
         *, says: Callable[[BaseException], bool] | None = None, time_s: float = TIME_S,
         peak_bytes: int | None = None, echoes: int = 0) -> Outcome:
    """Run `fn` and hold it to the three guarantees' first and third: a value, or an
    `allowed` error with a non-empty message of at most MAX_MESSAGE_CHARS that passes `says`
    (what the error must say: a field, a code); within `time_s`; and, when `peak_bytes` is
    given, run once more under tracemalloc (which slows it: the time is the first run's)
    within that peak. `fn` must then be pure.

    `echoes`: the size of what the caller sent that the message may quote back to that same
    caller (a runtime's CNI_COMMAND, a bind's pod name): the answer then costs no more than
    the question, up to 4 times it. What a pod wrote never goes back only to its writer
    (logs, Events, kube-scheduler), so it gets the fixed bound."""
    value, error, seconds = _run(fn, allowed)
    assert seconds <= time_s, f"took {seconds:.2f} s (bound {time_s} s)"
    peak = None
    if peak_bytes is not None:
        started_here = not tracemalloc.is_tracing()
        if started_here:
            tracemalloc.start()
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        try:
            again = _run(fn, allowed)
        finally:
            peak = tracemalloc.get_traced_memory()[1] - before
            if started_here:
                tracemalloc.stop()
        assert type(again[1]) is type(error), "a second run ended otherwise"
        assert peak <= peak_bytes, f"peak {peak >> 10} KiB (bound {peak_bytes >> 10} KiB)"
    event("taken" if error is None else f"refused: {type(error).__name__}")
    if error is not None:
        message = str(error)
        note(f"refused: {type(error).__name__}: {message[:300]}")
        assert message.strip(), f"{type(error).__name__} with an empty message"
        assert len(message) <= MAX_MESSAGE_CHARS + 4 * echoes, \
            f"{type(error).__name__} message of {len(message)} characters: {message[:200]}…"
        assert says is None or says(error), f"the message does not say where: {message[:300]}"
    return Outcome(value, error, seconds, peak)


def _run(fn: Callable[[], Any], allowed: type[BaseException] | tuple[type[BaseException], ...]
         ) -> tuple[Any, BaseException | None, float]:
    t0 = time.perf_counter()
    try:
        return fn(), None, time.perf_counter() - t0
    except allowed as e:
        return None, e, time.perf_counter() - t0
    except BaseException as e:
        note(f"escaped: {type(e).__name__}: {str(e)[:300]}")
        raise AssertionError(f"{type(e).__name__} escaped, not {_names(allowed)}") from e


def _names(kinds: type[BaseException] | tuple[type[BaseException], ...]) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(k.__name__ for k in kinds)


def names_a_field(error: BaseException) -> bool:
    """`<field>: <reason>`, or a reason saying what was expected."""
    message = str(error)
    head, sep, reason = message.partition(": ")
    return bool(sep and head.strip() and reason.strip()) or "expected" in message
