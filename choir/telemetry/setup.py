"""Turning telemetry on and off: the SDK, its OTLP/HTTP exporter, and a bounded flush.

``start`` imports the OpenTelemetry SDK (the ``otel`` extra) only when asked. The SDK reads
the standard variables itself: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``),
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_BSP_*``. Choir sets only what it must: the service name ``choir`` when none is given,
and a short export timeout when none is given, because a collector that is down or hangs
must never hold up a run or change its result: ``stop`` waits for the export at most a few
seconds, then drops what is left.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from choir._version import __version__
from choir.exceptions import MissingExtraError
from choir.telemetry import spans

INSTALL = "pip install 'choir[otel]'"
# seconds one export request may take when OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT is not set
EXPORT_TIMEOUT_S = 3.0
_TIMEOUT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")

_provider: Any = None
_processor: Any = None


def wanted(flag: bool = False) -> bool:
    """``--otel`` was given, or ``CHOIR_OTEL`` is set to a true value."""
    return flag or os.environ.get("CHOIR_OTEL", "").strip().lower() in {"1", "true", "yes", "on"}


def _timeout() -> float:
    """The export timeout: the standard variable's when set, else ``EXPORT_TIMEOUT_S``."""
    for var in _TIMEOUT_VARS:
        raw = os.environ.get(var, "").strip()
        if raw:
            try:
                return float(raw)
            except ValueError:
                break
    return EXPORT_TIMEOUT_S


def start(exporter: Any = None) -> None:
    """Record spans from now on: to ``exporter`` (tests: the SDK's in-memory one, exported as
    each span ends), else to the OTLP/HTTP endpoint the environment names, in batches.
    Starting again while on does nothing.

    Raises:
        MissingExtraError: the ``otel`` extra is not installed.
    """
    global _provider, _processor
    if spans.enabled():
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise MissingExtraError(
            f"--otel (or CHOIR_OTEL=1) needs the OpenTelemetry SDK and its OTLP exporter: "
            f"{INSTALL}") from exc
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "choir"}
    resource = Resource.create({**named, "service.version": __version__})
    processor: Any = (BatchSpanProcessor(OTLPSpanExporter(timeout=_timeout()))
                      if exporter is None else SimpleSpanProcessor(exporter))
    # no exit hook: ``stop`` flushes within its bound; an exit hook would wait on a dead
    # collector for the SDK's 30 s
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(processor)
    _provider, _processor = provider, processor
    spans.install(provider.get_tracer("choir", __version__))


def stop() -> None:
    """Stop recording and send what is buffered, waiting at most the export timeout plus a
    second; spans a dead collector did not take are dropped."""
    global _provider, _processor
    if _provider is None:
        return
    spans.install(None)
    processor, _provider, _processor = _processor, None, None
    # the SDK's own shutdown may wait 30 s on a collector that hangs: it runs in a daemon
    # thread, given the export timeout plus a second, then left behind
    flushing = threading.Thread(target=processor.shutdown, name="choir-otel-flush", daemon=True)
    flushing.start()
    flushing.join(_timeout() + 1.0)


@contextmanager
def session(flag: bool = False) -> Iterator[None]:
    """Telemetry on for the ``with`` block when ``wanted(flag)``; what the CLI wraps
    ``choir run`` and ``choir verify`` in. Already on (a test's exporter): left as it is.

    Raises:
        MissingExtraError: asked for, and the ``otel`` extra is not installed.
    """
    if not wanted(flag) or spans.enabled():
        yield
        return
    start()
    try:
        yield
    finally:
        stop()
