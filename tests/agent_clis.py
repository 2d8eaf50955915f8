"""Agent CLIs in tests: stand-in programs on PATH and the model API they call over HTTP.

``install_standins`` puts ``claude``, ``codex``, ``aider`` and ``opencode`` on a folder the
test prepends to PATH (``tests/fixtures/agent_clis/standin.py``: each speaks its real CLI's
non-interactive flags). ``ModelAPI`` serves the Anthropic Messages API, OpenAI's chat
completions and OpenAI's Responses API on 127.0.0.1 from one scripted function of the
prompt; it records every request with the headers the stand-in sent about itself.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STANDIN = Path(__file__).parent / "fixtures" / "agent_clis" / "standin.py"
PROGRAMS = ("claude", "codex", "aider", "opencode")
API_KEY = "sk-standin-not-a-secret"


def install_standins(folder: Path) -> Path:
    """The four stand-ins, executable, in ``folder`` (made); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in PROGRAMS:
        shutil.copy(STANDIN, folder / name)
        (folder / name).chmod(0o755)
    folder.chmod(0o755)
    return folder


@dataclass
class Call:
    path: str
    prompt: str
    headers: dict[str, str]


@dataclass
class ModelAPI:
    """The model API on 127.0.0.1; ``reply(prompt)`` is the text the model answers."""

    reply: Callable[[str], str]
    calls: list[Call] = field(default_factory=list)
    port: int = 0

    def __enter__(self) -> ModelAPI:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _answer(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        if path == "/v1/messages":
            prompt = " ".join(m["content"] for m in body["messages"])
            authorized = headers.get("x-api-key") == API_KEY
        else:
            prompt = body["input"] if path == "/v1/responses" else \
                " ".join(m["content"] for m in body["messages"])
            authorized = headers.get("authorization") == f"Bearer {API_KEY}"
        if not authorized:
            return 401, {"error": {"message": "bad key"}}
        self.calls.append(Call(path, prompt, headers))
        text = self.reply(prompt)
        if path == "/v1/messages":
            return 200, {"id": "msg_1", "type": "message", "role": "assistant",
                         "content": [{"type": "text", "text": text}],
                         "stop_reason": "end_turn",
                         "usage": {"input_tokens": 10, "output_tokens": 5}}
        if path == "/v1/responses":
            return 200, {"id": "resp_1", "object": "response", "status": "completed",
                         "output": [{"type": "message", "role": "assistant", "content": [
                             {"type": "output_text", "text": text}]}]}
        return 200, {"id": "chatcmpl-1", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text},
             "finish_reason": "stop"}]}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                path = self.path.split("?")[0]
                if path not in ("/v1/messages", "/v1/responses", "/v1/chat/completions"):
                    status, answer = 404, {"error": {"message": f"no route {path}"}}
                else:
                    status, answer = owner._answer(path, body, headers)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def edits(summary: str, files: dict[str, str]) -> str:
    """A model reply the stand-ins apply: files (path to content) and a summary."""
    return json.dumps({"summary": summary,
                       "edits": [{"path": p, "content": c} for p, c in files.items()]})
