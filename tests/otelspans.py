"""Helpers for the OpenTelemetry tests: an in-memory exporter, the tree of what it caught,
and a loopback OTLP/HTTP receiver that decodes what it is sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def recording() -> Iterator[Any]:
    """Telemetry on, to the SDK's in-memory exporter, for the ``with`` block."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from choir import telemetry

    exporter = InMemorySpanExporter()
    telemetry.start(exporter=exporter)
    try:
        yield exporter
    finally:
        telemetry.stop()


def by_name(spans: Any, name: str) -> list[Any]:
    return [s for s in spans if s.name == name]


def parent_of(spans: Any, child: Any) -> Any:
    """The finished span that is ``child``'s parent (None for a root)."""
    if child.parent is None:
        return None
    return next((s for s in spans if s.context.span_id == child.parent.span_id), None)


def all_text(spans: Any) -> str:
    """Every name, attribute key and value and event a list of spans carries, as one text."""
    parts: list[str] = []
    for s in spans:
        parts.append(s.name)
        parts.extend(f"{k}={v}" for k, v in (s.attributes or {}).items())
        for event in s.events:
            parts.append(event.name)
            parts.extend(f"{k}={v}" for k, v in (event.attributes or {}).items())
        parts.append(str(s.status.description or ""))
        parts.extend(f"{k}={v}" for k, v in s.resource.attributes.items())
    return "\n".join(parts)


@dataclass
class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1 (``hang``: accept, never answer)."""

    hang: bool = False
    bodies: list[bytes] = field(default_factory=list)
    hits: int = 0
    _server: ThreadingHTTPServer | None = None
    _release: threading.Event = field(default_factory=threading.Event)

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.hits += 1
                if receiver.hang:
                    receiver._release.wait(60)
                    return
                if self.path == "/v1/traces":
                    receiver.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def spans(self) -> list[Any]:
        """Every span received, decoded with ``opentelemetry.proto`` (with its resource)."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        out = []
        for body in self.bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value
                            for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    out.extend((resource, s) for s in scope.spans)
        return out
