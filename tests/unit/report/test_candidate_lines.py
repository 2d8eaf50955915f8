"""The parsers read a log's lines that could matter and count the rest: exactly what reading
every line would find (the test below), at a cost that does not grow with how short the lines
are (a 10 MiB log of six-byte lines took 10-20 s through ``bounded_lines``).

The reference is ``bounded_lines``, line by line; windows and lines are made tiny so that
lines span windows, windows hold no newline, and lines are cut, in every mix.
"""

from __future__ import annotations

import io
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choir.report import parsers
from choir.report.parsers import Tally, bounded_lines, candidate_lines

PIECES = [b"\n", b"\r\n", b"x", b"abc ", b"error", b"ERROR", b"Err", b"or", b"$ ",
          b"FAILED ", b"ERROR ", b"in 3", b"in 0.5s ", b"\xc3\xa9", b"\xff", b"\xe2\x84\xaa",
          b"ASSERT", b"tRaCeBaCk", b" ", b"z" * 9]
TESTS = {  # the exact test each parser applies to a line's text, and its byte filter
    "generic": (lambda line: bool(parsers._ERROR_LINE.search(line))
                and not line.startswith("$ "), parsers._MAYBE_ERROR),
    "pytest": (lambda line: bool(parsers._PYTEST_FAIL.match(line)
                                 or re.search(r"\bin \d+(\.\d+)?s\b", line)),
               parsers._MAYBE_PYTEST),
}


def _both(data: bytes, kind: str) -> tuple[object, object]:
    test, maybe = TESTS[kind]
    lines = list(bounded_lines(io.BytesIO(data)))
    expected = ([(n, t) for n, t, _ in lines if test(t)],
                lines[-1][0] if lines else 0, any(size > parsers.LINE_MAX for *_, size in lines))
    tally = Tally()
    found = [(n, t) for n, t in candidate_lines(io.BytesIO(data), maybe, tally) if test(t)]
    return (found, tally.last, tally.truncated), expected


@settings(max_examples=400, deadline=None)
@given(data=st.lists(st.sampled_from(PIECES), max_size=60).map(b"".join),
       line_max=st.integers(2, 12), window=st.integers(1, 24),
       kind=st.sampled_from(sorted(TESTS)))
def test_the_candidates_are_what_every_line_read_would_find(
        data: bytes, line_max: int, window: int, kind: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parsers, "LINE_MAX", line_max)
        patch.setattr(parsers, "WINDOW", window)
        found, expected = _both(data, kind)
    assert found == expected


@pytest.mark.parametrize("kind", sorted(TESTS))
def test_a_log_of_real_sizes_reads_alike(kind: str) -> None:
    long = b"y" * (parsers.LINE_MAX + 3)
    data = (b"ok\n" * 300_000 + b"E: error one\n" + "caf\u00e9 error\n".encode() + long
            + b"\nFAILED t.py::x - boom\n" + b"ok\n" * 300_000 + b"== 1 failed in 2.5s ==")
    found, expected = _both(data, kind)
    assert found == expected and found[2]  # type: ignore[index]


def test_short_lines_cost_what_their_bytes_cost() -> None:
    """Ten MiB of six-byte lines, the shape of the log-cap test's log: one pass of the
    C-level search per window, not a Python step per line (kept loose: a busy machine)."""
    data = b"choir\n" * ((10 << 20) // 6)
    started = time.perf_counter()
    tally = Tally()
    read = list(candidate_lines(io.BytesIO(data), parsers._MAYBE_ERROR, tally))
    lines_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in bounded_lines(io.BytesIO(data[: len(data) // 10])):
        pass
    tenth_s = time.perf_counter() - started
    assert tally.last == data.count(b"\n") and not tally.truncated
    assert len(read) <= len(data) // parsers.WINDOW + 1  # a window's first line, whole
    assert lines_s < tenth_s, (lines_s, tenth_s)  # the whole log in less than a tenth by line
