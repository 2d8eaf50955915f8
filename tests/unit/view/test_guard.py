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
