"""The real local model for tests (``choir.testing.local_model``), and a recorder in front.

Without the ``realmodel`` profile the tests skip, naming the install command; in CI (``CI``
set) they fail instead: CI installs the profile, so a broken install cannot turn these
tests into silent skips.

The recorder is a loopback proxy that keeps every request and reply as they crossed the
wire, with their time, so a test can check what litellm really sent (the output bound, the
schema's form) and what the server really did with it (tokens written, seconds taken).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from choir.testing.local_model import LocalModelServer, missing


def profile_or_skip() -> None:
    """Skip (fail in CI) when the profile is not installed."""
    reason = missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the realmodel profile is missing: {reason}")
        pytest.skip(f"the realmodel profile is not installed (set CI=1 to make this a "
                    f"failure): {reason}")


def local_model_or_skip() -> LocalModelServer:
    """A started server; skipped (failed in CI) when the profile is not installed."""
    profile_or_skip()
    return LocalModelServer().start()


@dataclass
class Exchange:
    """One request as sent and, once the server answered, its reply and time."""

    path: str
    body: dict[str, Any]
    status: int = 0  # 0 while the server has not answered
    reply: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def completion_tokens(self) -> int:
        return int((self.reply.get("usage") or {}).get("completion_tokens") or 0)

    @property
    def content(self) -> str:
        choices = self.reply.get("choices") or [{}]
        return str((choices[0].get("message") or {}).get("content") or "")

    def role(self) -> str:
        """reporter, director or executor, from the system prompt it was given."""
        system = str((self.body.get("messages") or [{}])[0].get("content") or "")
        for role, mark in (("reporter", "verification reporter"),
                           ("director", "Director of a verification loop")):
            if mark in system:
                return role
        return "executor"


@dataclass
class Recorder:
    """A proxy on 127.0.0.1 in front of ``upstream`` (an ``http://host:port`` origin).

    A request is kept when it arrives; its reply when the server gives it, which can be
    long after the client gave up (llama.cpp's server finishes a reply nobody waits for).
    """

    upstream: str
    exchanges: list[Exchange] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)  # a first request came
    _server: ThreadingHTTPServer | None = None

    @property
    def api_base(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                exchange = Exchange(self.path, json.loads(data or b"{}"))
                owner.exchanges.append(exchange)
                owner.arrived.set()
                request = urllib.request.Request(
                    owner.upstream + self.path, data=data, method="POST",
                    headers={k: v for k, v in self.headers.items()
                             if k.lower() in ("authorization", "content-type")})
                began = time.monotonic()
                try:
                    with urllib.request.urlopen(request, timeout=600) as reply:
                        status, answer = int(reply.status), reply.read()
                except urllib.error.HTTPError as exc:
                    status, answer = exc.code, exc.read()
                except (urllib.error.URLError, OSError) as exc:  # the server is gone
                    status, answer = 502, json.dumps({"error": {"message": str(exc)}}).encode()
                seconds = time.monotonic() - began
                try:
                    parsed = json.loads(answer)
                except ValueError:
                    parsed = {"raw": answer.decode("utf-8", "replace")}
                exchange.reply, exchange.seconds, exchange.status = parsed, seconds, status
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:  # the client gave up (its deadline): the exchange is kept
                    pass

        return Handler

    def __enter__(self) -> Recorder:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def by_role(self, role: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.role() == role]

    def drain(self, limit_s: float) -> list[Exchange]:
        """Wait (at most ``limit_s``) for the server to answer every request; the answered."""
        deadline = time.monotonic() + limit_s
        while any(e.status == 0 for e in self.exchanges) and time.monotonic() < deadline:
            time.sleep(0.2)
        return [e for e in self.exchanges if e.status]
