"""The token guard in front of the viewer and of ``choir mcp --transport http``."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from choir.view.guard import TokenGuard


def test_a_websocket_is_refused_whatever_it_carries() -> None:
    """The guard checked the token and Host of http requests only and passed every other
    scope on unchecked (a review's note): a websocket route, were one ever added, would
    have answered any local page. A websocket is refused outright; nothing is served."""
    reached: list[str] = []

    async def echo(socket: WebSocket) -> None:
        reached.append("app")
        await socket.accept()
        await socket.send_text("secret")
        await socket.close()

    app = TokenGuard(Starlette(routes=[WebSocketRoute("/ws", echo)]), "t0ken", 8123)
    client = TestClient(app, base_url="http://127.0.0.1:8123")
    for url in ("/ws", "/ws?token=t0ken"):
        with pytest.raises(WebSocketDisconnect), client.websocket_connect(url) as socket:
            socket.receive_text()
    assert reached == []


@pytest.mark.parametrize("path, where", [
    ("/%5Cevil.example", "/evil.example"),        # '/\\evil.example' reads as //evil.example
    ("/%5C%5Cevil.example/x", "/evil.example/x"),
    ("/a%5Cb", "/a%5Cb"),
    ("/%2F%2Fevil.example", "/evil.example"),
    ("/\\/evil.example", "/evil.example"),
    ("/run/a%20b", "/run/a%20b"),
    ("/", "/"),
])
def test_the_token_redirect_never_leaves_the_viewer(path: str, where: str) -> None:
    """Review 21, F4: the redirect that drops the token from the URL kept a backslash, and
    browsers read ``/\\host`` as ``//host``: another site. Every target is one path on this
    origin, percent-encoded."""
    from starlette.responses import PlainTextResponse

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        await PlainTextResponse("ok")(scope, receive, send)  # type: ignore[arg-type]

    client = TestClient(TokenGuard(app, "t0ken", 8123), base_url="http://127.0.0.1:8123")
    answer = client.get(f"{path}?token=t0ken&page=2", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == f"{where}?page=2"


@pytest.mark.parametrize("path, status, where", [
    ("/p0/%5Cevil.example", 303, "/p0/evil.example?page=2"),
    ("/p0//evil.example/x", 303, "/p0/evil.example/x?page=2"),
    ("/p0/run/a%20b", 303, "/p0/run/a%20b?page=2"),
    ("/p0", 303, "/p0/?token=t0ken&page=2"),  # the prefix named: on to its root
    ("/", 404, None), ("//p0/", 404, None), ("/p0x/", 404, None), ("/x/p0/", 404, None),
])
def test_a_prefixed_guard_answers_under_its_prefix_only(path: str, status: int,
                                                        where: str | None) -> None:
    """The viewer serves under a per-launch prefix (its cookie is scoped to it, as cookies
    are not scoped by port): the token redirect stays under it, and a request outside it is
    a 404 that never names it, even with the right token."""
    from starlette.responses import PlainTextResponse

    seen: list[str] = []

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        seen.append(str(scope["root_path"]))
        await PlainTextResponse("ok")(scope, receive, send)  # type: ignore[arg-type]

    client = TestClient(TokenGuard(app, "t0ken", 8123, prefix="/p0"),
                        base_url="http://127.0.0.1:8123")
    answer = client.get(f"{path}?token=t0ken&page=2", follow_redirects=False)
    assert answer.status_code == status
    assert answer.headers.get("location") == where and "p0" not in answer.text
    if status == 303 and path != "/p0":
        assert "Path=/p0/;" in answer.headers["set-cookie"]
        assert client.get("/p0/run/x").status_code == 200 and seen == ["/p0"]
    assert seen == ([] if status == 404 or path == "/p0" else ["/p0"])


def test_a_prefix_that_is_not_url_safe_is_refused() -> None:
    with pytest.raises(ValueError, match="URL-safe"):
        TokenGuard(lambda *a: None, "t0ken", 8123, prefix="/a/b")  # type: ignore[arg-type]
