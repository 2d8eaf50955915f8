"""Failure signatures: canonicalise away what changes between runs, then hash the rest.

The same failure in two runs gets the same id; a different test, rule or message does not.
What is removed: absolute and temp paths (kept as their last component), hex addresses,
timestamps, durations, uuids and long random ids, and local ports. Other numbers are kept:
``assert 1 == 2`` and ``assert 1 == 3`` are different failures (a pid or a remote port in a
message makes each run's failure look new: the streak that climbs a mood starts again).
A relative path is kept whole: ``tests/unit/test_api.py`` and ``tests/integration/
test_api.py`` are different tests (the absolute-path rule had made both
``teststest_api.py``, one failure id for two, the second dropped: review 17f).
"""

from __future__ import annotations

import re

from choir._core.canonical import blake3_hex

_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\x1b\[[0-9;?]*[A-Za-z]"), ""),  # ANSI escapes
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
     "<uuid>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"),
     "<time>"),
    (re.compile(r"\b\d{2}:\d{2}:\d{2}(?:\.\d+)?\b"), "<time>"),
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    # /abs/path/to/file.py -> file.py; only a path that starts at its first slash
    (re.compile(r"(?<![\w.@+-])(?:/[\w.@+-]+)+/([\w.@+-]+)"), r"\1"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|sec|seconds|us|µs|ns)\b"), "<dur>"),
    (re.compile(r"(?:localhost|127\.0\.0\.1|\[::1\]|0\.0\.0\.0):\d+"), "<host:port>"),
    (re.compile(r"\bport \d+\b", re.I), "port <n>"),
    (re.compile(r"\b[0-9a-f]{16,}\b", re.I), "<id>"),
    (re.compile(r"\b(?:tmp|pytest-)[\w-]*\d[\w-]*\b"), "<tmp>"),
    (re.compile(r"\s+"), " "),
]


def canonicalize(text: str, limit: int = 2000) -> str:
    """``text`` with run-to-run noise removed; bounded before and after."""
    text = text[: limit * 4]
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return text.strip()[:limit]


def signature_id(kind: str, test_id: str | None, location: str | None, message: str) -> str:
    """A stable id from the failure's kind, test or rule, location and canonical message."""
    loc = canonicalize(location or "")
    loc = re.sub(r":\d+(?::\d+)?$", "", loc) if kind in ("test", "junit") else loc
    parts = [kind, canonicalize(test_id or ""), loc, canonicalize(message)]
    return blake3_hex("\x1f".join(parts).encode("utf-8"))[:32]
