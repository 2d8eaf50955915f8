"""``choir mcp``'s stdio transport: the SDK's, fed request lines read up to a bound.

The SDK's ``stdio_server`` reads a whole line before parsing it, however long: a client (or a
tool argument a harness passes on) that sends hundreds of MiB with no newline grows the server
until the OOM killer ends it, and the verification it was running with it. Over HTTP the SDK
bounds a body (``DEFAULT_MAX_REQUEST_BODY_SIZE``); this is the same bound for a line. A longer
line is read on and thrown away up to its newline, never held, and answered with a JSON-RPC
parse error (addressed to the request's id when its first bytes name one, else ``null``), so
a client waiting on that request is told rather than left hanging; so is a line within the
bound that the SDK's reader cannot parse (it would drop it silently). The next line is read
as usual.

The SDK's writer still writes every answer; fd 0 is moved aside while serving (as the SDK
does for the streams it claims), so a child reading stdin sees EOF, not the wire.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any, BinaryIO, cast

import anyio

LINE_MAX = 4 * 1024 * 1024  # the SDK's DEFAULT_MAX_REQUEST_BODY_SIZE (checked by a test)
DISCARD_CHUNK = 64 << 10
ID_HEAD = 4096  # bytes of a refused line searched for its request id
_ID = re.compile(rb'^\s*\{.*?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,128}")', re.DOTALL)


def request_id(head: bytes) -> int | str | None:
    """The id a refused line's first bytes give its request, if they do (best effort: only
    its sender's own request can be the one addressed)."""
    found = _ID.match(head[:ID_HEAD])
    if found is None:
        return None
    value = json.loads(found.group(1))
    return value if isinstance(value, int | str) else None


def read_line(raw: BinaryIO, limit: int = LINE_MAX) -> tuple[bytes, bool] | None:
    """The next line and whether it was over ``limit`` (then only its first bytes, the rest
    read and dropped up to the newline); None at the end of the stream."""
    line = raw.readline(limit + 1)
    if not line:
        return None
    if line.endswith(b"\n") or len(line) <= limit:
        return line, False
    head = line[:ID_HEAD]
    del line
    while True:
        rest = raw.readline(DISCARD_CHUNK)
        if not rest or rest.endswith(b"\n"):
            return head, True


def _parses(text: str) -> bool:
    """Whether the SDK's reader will take ``text`` as a message. One it cannot parse (a
    value nested 100,000 deep, a number of a million digits) it hands on as an exception and
    no one answers: the client waited forever (review 16f). Such a line is answered here."""
    from mcp import types

    try:
        types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except Exception:  # noqa: BLE001 - pydantic's errors, whatever the shape of the line
        return False
    return True


class BoundedLines:
    """The SDK reader's ``stdin``: an async iterator of request lines (text) of at most
    ``LINE_MAX`` bytes; a longer one is answered through ``answer`` and skipped."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.answer: Any = None  # the server's write stream, once it exists
        self.ready = anyio.Event()

    def __aiter__(self) -> BoundedLines:
        return self

    async def __anext__(self) -> str:
        while True:
            found = await anyio.to_thread.run_sync(read_line, self.raw,
                                                   abandon_on_cancel=True)
            if found is None:
                raise StopAsyncIteration
            line, over = found
            if over:
                await self._refuse(request_id(line), f"request line over {LINE_MAX} bytes: "
                                   "discarded up to its newline, not parsed")
                continue
            text = line.decode("utf-8", errors="replace")
            if text.strip() and not _parses(text):  # the SDK would drop it with no answer
                await self._refuse(request_id(line), "not a JSON-RPC message this server can "
                                   "parse (nested too deep, a number too long, or no message)")
                continue
            return text

    async def _refuse(self, request: int | str | None, why: str) -> None:
        from mcp.shared.message import SessionMessage
        from mcp_types import PARSE_ERROR, ErrorData, JSONRPCError

        await self.ready.wait()
        error = ErrorData(code=PARSE_ERROR, message=why)
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await self.answer.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=request,
                                                               error=error)))


@asynccontextmanager
async def bounded_stdio() -> AsyncIterator[tuple[Any, Any]]:
    """``mcp.server.stdio.stdio_server`` reading fd 0 through ``BoundedLines``."""
    from mcp.server.stdio import stdio_server

    wire = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    # never closed: a reading thread may still block on it when the server ends
    lines = BoundedLines(os.fdopen(wire, "rb", closefd=False))
    try:
        async with stdio_server(stdin=cast(Any, lines)) as (read, write):
            lines.answer = write
            lines.ready.set()
            yield read, write
    finally:
        os.dup2(wire, 0)


__all__ = ["LINE_MAX", "BoundedLines", "bounded_stdio", "read_line", "request_id"]
