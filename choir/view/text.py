"""Artifact bytes as inert, bounded text: a window of lines, never the whole file.

An artifact is whatever a verified step printed, so it is hostile: escape sequences (CSI,
OSC 8 links, OSC 52 clipboard writes), bidi controls, invalid UTF-8, a line of a gigabyte.
Every line shown goes through the one terminal-safe helper (``strip_controls``), each line
is cut at ``LINE_MAX`` bytes while it is read (a 1 GiB line costs ``LINE_MAX`` bytes of
memory), a page holds at most ``PAGE_LINES`` lines, and the page's templates escape it all.

A citation is checked here, on the server: the span hash it carries is recomputed from the
stored bytes of the cited lines, and the object itself is re-hashed, before the page says
the cited lines are what the report saw.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from choir._core.terminal import strip_controls
from choir.evidence.artifacts import ArtifactStore

LINE_MAX = 4096
PAGE_LINES = 200
MAX_START = 1 << 40
VERIFY_MAX = 256 << 20  # re-hash on every view up to this size (blake3: well under a second)


@dataclass(frozen=True)
class Line:
    number: int
    text: str
    cut: bool  # longer than LINE_MAX bytes: only its start is shown
    cited: bool


@dataclass(frozen=True)
class Window:
    """Lines ``start..`` of an artifact, made safe to show, and what a citation says."""

    digest: str
    start: int
    count: int
    lines: tuple[Line, ...]
    more: bool  # lines follow this page
    object_ok: bool | None  # the stored bytes re-hash to the digest; None: too big to re-hash
    size: int
    cite: tuple[int, int] | None
    span_hash: str | None  # the citation's, as given
    span_ok: bool | None  # recomputed from the stored lines; None: nothing cited


def safe_line(raw: bytes) -> str:
    """One line of an artifact as text that neither a browser nor a terminal acts on."""
    text = raw.decode("utf-8", "replace").rstrip("\n").replace("\r", "")
    return strip_controls(text)


def _bounded(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def window(store: ArtifactStore, digest: str, *, start: int = 1, count: int = PAGE_LINES,
           cite: tuple[int, int] | None = None, span_hash: str | None = None) -> Window:
    """A page of ``digest``'s lines; with ``cite``, the cited lines are marked and, with
    ``span_hash``, the span hash is re-derived from the stored bytes and compared.

    Raises:
        IntegrityError: ``digest`` is not a digest, or the object is missing.
    """
    start = _bounded(start, 1, MAX_START)
    count = _bounded(count, 1, PAGE_LINES)
    with store.open(digest) as fh:  # missing or malformed: IntegrityError before anything
        size = os.fstat(fh.fileno()).st_size
    raw = store.read_lines(digest, start, start + count, line_max=LINE_MAX + 1)
    lines = tuple(
        Line(number=start + i, text=safe_line(piece[:LINE_MAX]), cut=len(piece) > LINE_MAX
             and piece[LINE_MAX:] != b"\n",
             cited=cite is not None and cite[0] <= start + i <= cite[1])
        for i, piece in enumerate(raw[:count]))
    span_ok = None
    if cite is not None and span_hash is not None:
        span_ok = store.span_hash(digest, cite[0], cite[1]) == span_hash
    return Window(digest=digest, start=start, count=count, lines=lines, more=len(raw) > count,
                  object_ok=store.verify(digest) if size <= VERIFY_MAX else None, size=size,
                  cite=cite, span_hash=span_hash, span_ok=span_ok)


def plain_page(store: ArtifactStore, digest: str, *, start: int = 1,
               count: int = PAGE_LINES) -> tuple[str, bool]:
    """The same window as plain text (the ``raw`` download): numbered lines, ``more``."""
    win = window(store, digest, start=start, count=count)
    text = "".join(f"{ln.text}{' [line cut]' if ln.cut else ''}\n" for ln in win.lines)
    return text, win.more
