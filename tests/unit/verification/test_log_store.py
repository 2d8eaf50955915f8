"""The run's log as stored (``_LogCap``) and the tail for people (``_Tail``), without a
sandbox: what is kept, what is marked, and that the fast path of the tail changes nothing."""

from __future__ import annotations

import random

from choir.verification.pipeline import LOG_END_KEEP, TAIL_LINE_MAX, TAIL_LINES, _LogCap, _Tail


def _slow_tail(data: bytes) -> str:
    """The tail's rules, written plainly: the last TAIL_LINES lines, each capped."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for line in lines[-TAIL_LINES:]:
        text = line[:TAIL_LINE_MAX].decode("utf-8", "replace")
        if len(line) > TAIL_LINE_MAX:
            text += f" [... line truncated: {len(line) - TAIL_LINE_MAX} more bytes]"
        out.append(text)
    return "\n".join(out)


def test_the_tail_keeps_the_last_lines_whatever_the_chunking() -> None:
    rng = random.Random(7)
    for _ in range(40):
        parts = [b"x" * rng.choice((0, 1, 5, 3000)) for _ in range(rng.randint(0, 900))]
        data = b"\n".join(parts) + rng.choice((b"", b"\n", b"tail-no-newline"))
        tail, at = _Tail(), 0
        while at < len(data):
            step = rng.choice((1, 7, 100, 4096, 65536))
            tail.feed(data[at:at + step])
            at += step
        assert tail.text() == _slow_tail(data)


def test_a_log_within_the_cap_is_kept_whole() -> None:
    cap = _LogCap(1)
    kept = b"".join(cap.admit(b"a" * 1000) for _ in range(100))
    end, cut = cap.end_step("s")
    assert kept + end == b"a" * 100_000 and cut is None


def test_past_the_cap_the_head_a_marker_and_the_end_are_kept() -> None:
    cap = _LogCap(1)
    data = bytes(range(256)) * 20_000  # 5,120,000 bytes
    head = b"".join(cap.admit(data[i:i + 65536]) for i in range(0, len(data), 65536))
    end, cut = cap.end_step("spew")
    assert len(head) == (1 << 20) - LOG_END_KEEP and data.startswith(head)
    marker, _, last = end.partition(b"bytes follow\n")
    assert b"[choir] log cut: " in marker and b"of step spew not kept" in marker
    assert last == data[-LOG_END_KEEP:]
    assert cut == len(data) - len(head) - LOG_END_KEEP
    assert len(head) + len(end) <= (1 << 20) + 300


def test_the_cap_spans_the_steps_of_a_run() -> None:
    cap = _LogCap(1)
    cap.admit(b"a" * (2 << 20))
    cap.end_step("one")
    assert cap.admit(b"b" * 10) == b""
    end, cut = cap.end_step("two")
    assert end == b"b" * 10 and cut is None  # all of it kept as the step's end
    cap.admit(b"c" * (LOG_END_KEEP + 5))
    end, cut = cap.end_step("three")
    assert cut == 5 and end.endswith(b"c" * LOG_END_KEEP)
