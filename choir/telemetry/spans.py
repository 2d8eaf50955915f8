"""The tracer facade: the only calls the rest of Choir makes, and no-ops while telemetry is off.

Off (the default), ``span`` returns one shared do-nothing context manager and the other calls
return at their first line: nothing from ``opentelemetry`` is imported and a hook costs a
global read. On (``choir.telemetry.setup.start``), they drive the SDK's tracer.

Spans nest through the current context (``contextvars``), which asyncio tasks and
``asyncio.to_thread`` copy, so a green thread's span is a child of its round even when the
threads run side by side. A span that outlives one call stack (a ``choir run`` round opens in
the Director's graph node and closes in adjudication) is opened with ``begin`` under a key and
closed with ``end``; ``within(key)`` makes it the parent of what runs inside, and ``span(...,
parent=key)`` names it explicitly. A plan driver opens its plan and item spans the same way.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from choir.telemetry.attributes import clean

Kind = Literal["internal", "client"]
Attrs = Mapping[str, Any] | None

# the SDK's tracer while telemetry is on; None is "off"
_tracer: Any = None
_lock = threading.Lock()
_open: dict[str, Any] = {}  # key -> span opened by ``begin``, not yet ended
# key -> SpanContext of a keyed span that ended: a later child (an attestation minted after
# its green thread finished) can still name it; bounded, oldest forgotten first
_ended: OrderedDict[str, Any] = OrderedDict()
_REMEMBER = 4096


class Span:
    """What a hook holds inside ``with span(...)``: ``set`` adds attributes learnt on the way."""

    __slots__ = ("_span",)

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def set(self, attrs: Attrs) -> None:
        """Add attributes (filtered by ``choir.telemetry.attributes.clean``)."""
        if self._span is not None and attrs:
            self._span.set_attributes(clean(attrs))


class _Off:
    """The shared no-op: ``with span(...) as s`` and ``s.set(...)`` cost a call each."""

    __slots__ = ()
    _handle = Span()

    def __enter__(self) -> Span:
        return self._handle

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> Span:
        return self._handle

    async def __aexit__(self, *exc: object) -> None:
        return None


_OFF = _Off()


def enabled() -> bool:
    """Whether spans are being recorded (a hook may skip work that only feeds a span)."""
    return _tracer is not None


def install(tracer: Any) -> None:
    """Record through ``tracer`` from now on (None: stop); ``setup`` is the one caller."""
    global _tracer
    with _lock:
        _tracer = tracer
        if tracer is None:
            _open.clear()
            _ended.clear()


def _context(parent: str | None) -> Any:
    """The parent context: the keyed span ``parent`` when known, else the current one."""
    if parent is None:
        return None
    from opentelemetry import trace

    with _lock:
        live = _open.get(parent)
        found = live.get_span_context() if live is not None else _ended.get(parent)
    if found is None:
        return None
    return trace.set_span_in_context(trace.NonRecordingSpan(found))


def _start(name: str, parent: str | None, kind: Kind, attrs: Attrs) -> Any:
    from opentelemetry.trace import SpanKind

    return _tracer.start_span(name, context=_context(parent), attributes=clean(attrs or {}),
                              kind=SpanKind.CLIENT if kind == "client" else SpanKind.INTERNAL)


def _remember(key: str, span: Any) -> None:
    with _lock:
        _ended[key] = span.get_span_context()
        while len(_ended) > _REMEMBER:
            _ended.popitem(last=False)


def _failed(span: Any, exc: BaseException) -> None:
    """Mark ``span`` failed by the exception's class alone: its message may quote output."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


class _Live:
    """A recorded span for a ``with`` or an ``async with`` block (a green thread opens its
    span beside the semaphore it waits on)."""

    __slots__ = ("_args", "_key", "_scope", "_span")

    def __init__(self, name: str, attrs: Attrs, key: str | None, parent: str | None,
                 kind: Kind) -> None:
        self._args, self._key = (name, parent, kind, attrs), key
        self._span: Any = None
        self._scope: Any = None

    def __enter__(self) -> Span:
        from opentelemetry import trace

        self._span = _start(*self._args)
        if self._key is not None:
            with _lock:
                _open[self._key] = self._span
        self._scope = trace.use_span(self._span, end_on_exit=False, record_exception=False,
                                     set_status_on_exception=False)
        self._scope.__enter__()
        return Span(self._span)

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self._scope.__exit__(kind, exc, tb)
        finally:
            if exc is not None:
                _failed(self._span, exc)
            self._span.end()
            if self._key is not None:
                with _lock:
                    _open.pop(self._key, None)
                _remember(self._key, self._span)

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(kind, exc, tb)


def span(name: str, attrs: Attrs = None, *, key: str | None = None,
         parent: str | None = None, kind: Kind = "internal") -> Any:
    """A span around the ``with`` block, the child of the current span (or of ``parent``).

    Args:
        name: the span's name (``choir.round``, ``chat MODEL``, ...; docs/observability.md).
        attrs: declared attributes (``choir.telemetry.attributes.ATTRIBUTES``); others are
            dropped.
        key: remember the span under this key once it ends, so that a later span can name it
            as ``parent``.
        parent: the key of a span opened with ``begin`` (or remembered by ``key``).
        kind: ``client`` for calls out of the process (model calls), else ``internal``.

    An exception leaving the block marks the span failed with its class name and propagates.
    """
    if _tracer is None:
        return _OFF
    return _Live(name, attrs, key, parent, kind)


def begin(key: str, name: str, attrs: Attrs = None, *, parent: str | None = None) -> None:
    """Open a span that ``end(key)`` closes, possibly from another call stack; opening a key
    that is already open does nothing (a graph node run again on resume)."""
    if _tracer is None:
        return
    with _lock:
        if key in _open:
            return
    opened = _start(name, parent, "internal", attrs)
    with _lock:
        _open.setdefault(key, opened)


def end(key: str, attrs: Attrs = None) -> None:
    """Close the span ``begin(key)`` opened, adding ``attrs``; an unknown key does nothing."""
    if _tracer is None:
        return
    with _lock:
        opened = _open.pop(key, None)
    if opened is None:
        return
    opened.set_attributes(clean(attrs or {}))
    opened.end()
    _remember(key, opened)


def end_under(prefix: str) -> None:
    """Close every open keyed span whose key starts with ``prefix`` (a run that stops at an
    approval gate or fails leaves its round open)."""
    if _tracer is None:
        return
    with _lock:
        keys = [k for k in _open if k.startswith(prefix)]
    for key in keys:
        end(key)


@contextmanager
def _within(key: str) -> Iterator[None]:
    from opentelemetry import context

    ctx = _context(key)
    if ctx is None:
        yield
        return
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


def within(key: str) -> Any:
    """Make the keyed span the parent of spans opened inside the ``with`` block."""
    if _tracer is None:
        return _OFF
    return _within(key)
