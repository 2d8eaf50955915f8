"""OpenTelemetry spans for runs, rounds, green threads, executor attempts and model calls.

Off by default: ``choir run --otel``, ``choir verify --otel`` or ``CHOIR_OTEL=1`` turn it on
(the ``otel`` extra: ``pip install 'choir[otel]'``). While off, nothing from
``opentelemetry`` is imported and every hook is a no-op. Spans carry hashes, names, counts
and verdicts only (``attributes.py`` declares every name they may carry).

- ``spans.py``: the facade the rest of Choir calls (``span``, ``begin``/``end``, ``within``);
- ``setup.py``: the SDK and its OTLP/HTTP exporter, switched on and flushed within a bound;
- ``genai.py``: a model call under the GenAI semantic conventions;
- ``attributes.py``: the declared attributes and the filter every value passes.
"""

from __future__ import annotations

from choir.telemetry.genai import model_call, usage
from choir.telemetry.setup import session, start, stop, wanted
from choir.telemetry.spans import Span, begin, enabled, end, end_under, span, within

__all__ = [
    "Span",
    "begin",
    "enabled",
    "end",
    "end_under",
    "model_call",
    "session",
    "span",
    "start",
    "stop",
    "usage",
    "wanted",
    "within",
]
