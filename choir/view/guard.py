"""Who may talk to the viewer, and what a browser may do with its pages.

The viewer listens on loopback, but any local process, and any web page the user opens
(through DNS rebinding or a cross-site request), can reach a loopback port. So every request
must carry the per-launch token: in the URL of the first request (the one ``choir view``
prints), then in a cookie set from it (``HttpOnly``, ``SameSite=Strict``, so no other site's
request carries it). Cookies are not scoped by port: one set with ``Path=/`` goes to every
server on ``127.0.0.1`` the browser visits (a dev server, another tool), which would then hold
the token. So the viewer serves under a random per-launch path prefix, its cookie is scoped to
that path, and a request outside it is a 404 that never names it. The ``Host`` header must
name the loopback address the server listens on, which a rebound name cannot. Every response
carries a Content-Security-Policy that allows no script at all, so even a template mistake
cannot run artifact text as code.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_PREFIX = re.compile(r"/[A-Za-z0-9_-]+")
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


def header(scope: Scope, name: bytes) -> str:
    """The request header ``name`` (lower-case bytes), decoded; empty when absent."""
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


class TokenGuard:
    """ASGI middleware: refuse every request without the token; add the security headers.

    ``prefix`` (``/`` and URL-safe characters, no trailing slash; empty: none): the path the
    app is served under. A request outside it is a 404; inside it, the app sees the prefix
    as its ``root_path`` (the ASGI convention for an app mounted under a path).
    """

    def __init__(self, app: ASGIApp, token: str, port: int, *, prefix: str = "") -> None:
        if prefix and not _PREFIX.fullmatch(prefix):
            raise ValueError(f"prefix {prefix!r}: give '/' and URL-safe characters "
                             "(secrets.token_urlsafe), no trailing slash")
        self.app, self.token, self.port, self.prefix = app, token, port, prefix
        self.cookie = f"choir_view_{port}"
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}

    def _inside(self, path: str) -> bool:
        """Whether ``path`` is the prefix or under it (compared in constant time: the prefix
        is a secret a timing probe must not learn character by character)."""
        n = len(self.prefix)
        return hmac.compare_digest(path[:n].encode(), self.prefix.encode()) and \
            path[n:n + 1] in ("", "/")

    def _ok(self, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    serves = "viewer"  # for the refusal of a foreign Host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # the server's own start and stop, no client
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a websocket (no route takes one today) is refused
            # outright, never passed on unchecked as it was
            await send({"type": "websocket.close", "code": 1008})
            return
        if header(scope, b"host") not in self.hosts:
            await plain(send, 403, f"forbidden: this {self.serves} answers on its loopback "
                                    "address only")
            return
        path = str(scope.get("path", "/"))
        if not self._inside(path):  # never named in the answer: it is the secret
            await plain(send, 404, "not found: open the URL `choir view` printed")
            return
        if self.prefix:
            if path == self.prefix:  # the client named the prefix: on to its root
                query = bytes(scope.get("query_string", b"")).decode("latin-1")
                where = f"{self.prefix}/" + (f"?{query}" if query else "")
                await plain(send, 303, "see other", [(b"location", where.encode("latin-1"))])
                return
            scope = {**scope, "root_path": str(scope.get("root_path", "")) + self.prefix}
        await self.authorized(scope, receive, send)

    async def authorized(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Past the Host check: the token from the printed URL, kept in a cookie."""
        query = parse_qsl(bytes(scope.get("query_string", b"")).decode("latin-1"))
        given = [v for k, v in query if k == "token"]
        if given:  # the printed URL: keep the token in a cookie, then drop it from the URL
            if not self._ok(given[-1]):
                await plain(send, 403, "forbidden: wrong token")
                return
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            # the prefix, one slash and every other byte percent-encoded: ``//host/x`` would
            # send the browser to another site, and so would ``/\\host`` (read as ``//``:
            # review 21)
            path = str(scope.get("path", "/"))[len(self.prefix):].lstrip("/\\")
            where = f"{self.prefix}/" + quote(path, safe="/") + (f"?{rest}" if rest else "")
            # scoped to the prefix: a browser sends cookies to every port of 127.0.0.1
            cookie = (f"{self.cookie}={self.token}; Path={self.prefix}/; HttpOnly; "
                      "SameSite=Strict")
            await plain(send, 303, "see other", [(b"location", where.encode("latin-1")),
                                                  (b"set-cookie", cookie.encode())])
            return
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(header(scope, b"cookie"))
        except Exception:  # a malformed cookie header is no token
            jar = SimpleCookie()
        morsel = jar.get(self.cookie)
        if morsel is None or not self._ok(morsel.value):
            await plain(send, 403, "forbidden: open the URL `choir view` printed (it carries "
                                    "this launch's token)")
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


async def plain(send: Send, status: int, text: str,
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """A whole plain-text response (the refusals every guard sends), never HTML."""
    body = (text + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            *SECURITY_HEADERS, *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
