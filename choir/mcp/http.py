"""``choir mcp --transport http``: streamable HTTP on loopback, behind a per-launch token.

Any local process, and any web page the user opens (DNS rebinding, a cross-site request), can
reach a loopback port, so the viewer's rule holds here too (``choir.view.guard``): the ``Host``
header must name the address the server listens on, and every request carries the token. An
MCP client sends it as ``Authorization: Bearer TOKEN`` (a header a browser's cross-site
request cannot set); there is no cookie and no token in a URL. The token is made for this
launch, or taken from ``CHOIR_MCP_TOKEN`` so a client's configuration can name it in advance.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import Any

from choir.exceptions import UserError
from choir.mcp.server import build
from choir.mcp.tools import Tools
from choir.view.guard import Receive, Scope, Send, TokenGuard, header, plain
from choir.view.serve import HOST, listen

TOKEN_ENV = "CHOIR_MCP_TOKEN"
TOKEN_MIN = 32
PATH = "/mcp"


class BearerGuard(TokenGuard):
    """The viewer's guard (loopback ``Host``, constant-time token check), with the token in
    the ``Authorization`` header."""

    serves = "server"

    async def authorized(self, scope: Scope, receive: Receive, send: Send) -> None:
        scheme, _, given = header(scope, b"authorization").partition(" ")
        if scheme.lower() != "bearer" or not self._ok(given.strip()):
            await plain(send, 401, "unauthorized: send `Authorization: Bearer TOKEN` with "
                                    "the token `choir mcp` printed",
                         [(b"www-authenticate", b'Bearer realm="choir-mcp"')])
            return
        await self.app(scope, receive, send)


def launch_token() -> str:
    """``CHOIR_MCP_TOKEN`` when set (long enough to resist guessing), else a fresh one.

    Raises:
        UserError: ``CHOIR_MCP_TOKEN`` is set but shorter than ``TOKEN_MIN``.
    """
    given = os.environ.get(TOKEN_ENV, "")
    if not given:
        return secrets.token_urlsafe(32)
    if len(given) < TOKEN_MIN or not given.isprintable() or " " in given:
        raise UserError(f"{TOKEN_ENV}: a token of at least {TOKEN_MIN} printable characters "
                        "without spaces\n  fix: unset it (a fresh token is made), or set e.g. "
                        "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    return given


def serve_http(tools: Tools, port: int = 0, *,
               announce: Callable[[str, str], None]) -> None:
    """Serve on ``127.0.0.1:port`` (0: a free port) until interrupted; ``announce`` gets the
    URL and the token before the first request can arrive."""
    import uvicorn

    token = launch_token()
    sock = listen(port)
    bound = sock.getsockname()[1]
    server = build(tools)
    app: Any = BearerGuard(server.streamable_http_app(streamable_http_path=PATH, host=HOST),
                           token, bound)
    config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                            date_header=False, timeout_graceful_shutdown=5)
    announce(f"http://{HOST}:{bound}{PATH}", token)
    uvicorn.Server(config).run(sockets=[sock])


__all__ = ["TOKEN_ENV", "BearerGuard", "launch_token", "serve_http"]
