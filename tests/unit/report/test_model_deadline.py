"""A model call's deadline holds for the whole call, against a real HTTP server on 127.0.0.1
that answers at once and then sends its body a byte a second (review 17, F3): litellm's
``timeout`` bounds each read, so a 3 s deadline became 20 s or more, and the Director's
advice (which nothing else bounds) waited as long as the server liked."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from choir.llm import ask_json

TRICKLE_S = 12
pytestmark = pytest.mark.slow  # about 10 s (litellm's first import, then the timed call)


class _Reply(BaseModel):
    reason: str


def _handle(conn: socket.socket, stop: threading.Event) -> None:
    body = json.dumps({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": json.dumps({"reason": "late"})}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for _ in range(TRICKLE_S):
            if stop.wait(1):
                return
            conn.sendall(b"1\r\n \r\n")
        conn.sendall(b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
    except OSError:
        pass
    finally:
        conn.close()


@pytest.fixture
def trickle() -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=_handle, args=(conn, stop), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        stop.set()
        sock.close()


def test_a_reply_sent_a_byte_a_second_does_not_outlive_the_deadline(trickle: str) -> None:
    # a first call loads litellm (seconds on a fresh install, with no bytecode cache yet):
    # that is not the call this test times
    asyncio.run(ask_json("openai/fake", [{"role": "user", "content": "hi"}], _Reply,
                         deadline_s=1.0, attempts=1, api_base="http://127.0.0.1:9/v1",
                         api_key="sk-fake"))
    started = time.monotonic()
    reply, _spent, fault = asyncio.run(ask_json(
        "openai/fake", [{"role": "user", "content": "hi"}], _Reply, deadline_s=3.0,
        api_base=trickle, api_key="sk-fake"))
    assert time.monotonic() - started < 6, "the call outlived its deadline"
    assert reply is None and fault
