"""A scripted model: replies in order, each a text or tool calls, and every request kept.

``FakeModel`` is a ``ModelClient`` used in process. ``FakeModelServer`` serves the same
script as an OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1, so the real litellm
path (HTTP, parsing, usage) is exercised: point ``api_base`` at ``server.api_base``.
A script step may be a callable of the request's messages, for replies that depend on it,
or an ``Exception`` instance (raised in process) / an HTTP status (served) to inject faults.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from choir.agent.llm import ModelReply, ToolCall
from choir.models import Usage

Step = ModelReply | Exception | int | Callable[[list[dict[str, Any]]], ModelReply]
_ids = itertools.count(1)


class ScriptExhausted(RuntimeError):
    """The model was asked for more replies than its script holds."""


def text(content: str) -> ModelReply:
    """A plain text reply."""
    return ModelReply(content=content)


def tool_call(name: str, arguments: dict[str, Any] | str | None = None) -> ToolCall:
    """One tool call; ``arguments`` may be raw text, to script malformed JSON."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCall(id=f"call_{next(_ids)}", name=name, arguments=args)


def reply(*calls: ToolCall, content: str | None = None) -> ModelReply:
    """A reply carrying tool calls (and optional text)."""
    return ModelReply(content=content, tool_calls=tuple(calls))


def final_output(**arguments: Any) -> ModelReply:
    """A reply that calls ``final_output`` with ``arguments``."""
    return reply(tool_call("final_output", arguments))


@dataclass
class FakeModel:
    """A ``ModelClient`` that plays ``script`` and records every request.

    Args:
        script: the replies, in order.
        repeat_last: keep replaying the last step instead of raising ``ScriptExhausted``.
        tokens: prompt and completion tokens reported per reply.
    """

    script: list[Step]
    repeat_last: bool = False
    tokens: tuple[int, int] = (10, 5)
    name: str = "fake/scripted"
    requests: list[list[dict[str, Any]]] = field(default_factory=list)
    tool_sets: list[list[dict[str, Any]]] = field(default_factory=list)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def step(self, messages: list[dict[str, Any]]) -> Step:
        with self._lock:
            self.requests.append(json.loads(json.dumps(messages)))
            if self._next >= len(self.script):
                if not (self.repeat_last and self.script):
                    raise ScriptExhausted(f"the script has {len(self.script)} replies; "
                                          f"reply {self._next + 1} was asked for")
                return self.script[-1]
            self._next += 1
            return self.script[self._next - 1]

    def resolve(self, messages: list[dict[str, Any]]) -> ModelReply | Exception | int:
        found = self.step(messages)
        if callable(found) and not isinstance(found, ModelReply):
            return found(messages)
        return found

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]]) -> ModelReply:
        self.tool_sets.append(tools)
        found = self.resolve(messages)
        if isinstance(found, Exception):
            raise found
        if isinstance(found, int):
            raise RuntimeError(f"scripted HTTP {found}")
        prompt, completion = self.tokens
        return ModelReply(content=found.content, tool_calls=found.tool_calls,
                          usage=Usage(model=self.name, prompt_tokens=prompt,
                                      completion_tokens=completion))

    @property
    def calls(self) -> int:
        return len(self.requests)

    def sent(self) -> str:
        """Every request so far as one JSON text (to assert what a model never saw)."""
        return json.dumps(self.requests)


def _completion_body(found: ModelReply, model: str, tokens: tuple[int, int]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": found.content}
    if found.tool_calls:
        message["tool_calls"] = [c.as_message() for c in found.tool_calls]
    return {"id": f"chatcmpl-{next(_ids)}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if found.tool_calls else "stop"}],
            "usage": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1],
                      "total_tokens": sum(tokens)}}


class FakeModelServer:
    """The script served over HTTP on 127.0.0.1 (a context manager).

    ``model`` is the litellm name to use (``openai/<name>``) and ``api_base`` the URL.
    ``bodies`` holds every request body received, parsed.
    """

    def __init__(self, script: Iterable[Step], *, name: str = "fake-model",
                 repeat_last: bool = False, delay_s: float = 0.0) -> None:
        self.fake = FakeModel(list(script), repeat_last=repeat_last, name=name)
        self.delay_s = delay_s
        self.bodies: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def model(self) -> str:
        return f"openai/{self.fake.name}"

    @property
    def api_base(self) -> str:
        assert self._server is not None, "start the server first (use it as a context)"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def settings(self) -> dict[str, Any]:
        """``model_settings`` for an Agent (or litellm kwargs) that reach this server."""
        return {"api_base": self.api_base, "api_key": "sk-fake-not-a-secret"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                owner.bodies.append(body)
                if not self.path.rstrip("/").endswith("chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if owner.delay_s:
                    time.sleep(owner.delay_s)
                try:
                    found = owner.fake.resolve(body.get("messages", []))
                except ScriptExhausted as exc:
                    self._send(500, {"error": {"message": str(exc)}})
                    return
                if isinstance(found, int):
                    self._send(found, {"error": {"message": f"scripted {found}",
                                                 "type": "server_error"}})
                elif isinstance(found, Exception):
                    self._send(500, {"error": {"message": str(found)}})
                else:
                    self._send(200, _completion_body(found, owner.fake.name,
                                                     owner.fake.tokens))

        return Handler

    def __enter__(self) -> FakeModelServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def sent(self) -> str:
        return json.dumps(self.bodies)
