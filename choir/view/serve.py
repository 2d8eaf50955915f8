"""Starting the viewer: a socket on loopback, a fresh token, uvicorn."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable
from pathlib import Path

from choir._core.paths import choir_home
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import UserError
from choir.view.reads import Stores

HOST = "127.0.0.1"
PREFIX_BYTES = 18  # the per-launch path prefix: 144 random bits


def build(home: Path | None = None, artifacts_root: Path | None = None,
          token: str | None = None, port: int = 0, *, warm: bool = False,
          prefix: str = "") -> tuple[object, str]:
    """The guarded ASGI app over ``home`` and its token (for tests and ``serve``).

    ``prefix``: the path it is served under (``/<prefix>``; ``serve`` makes a random one per
    launch, so the token's cookie, scoped to it, never goes to another server on loopback).

    ``warm``: read every stored run into the run list's index now, so that no page request
    pays for it (with ten thousand runs the index takes seconds; a page then takes tens of
    milliseconds).
    """
    from choir.view.app import Viewer
    from choir.view.guard import TokenGuard

    token = token or secrets.token_urlsafe(24)
    stores = Stores(home or choir_home(), ArtifactStore(artifacts_root))
    viewer = Viewer(stores, root=prefix)
    if warm:
        viewer.index.rows()
    return TokenGuard(viewer.app, token, port, prefix=prefix), token


def listen(port: int) -> socket.socket:
    """A socket listening on ``127.0.0.1:port`` (0: a free one).

    Raises:
        UserError: the port cannot be had (taken, or privileged), saying which and how.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}\n"
                        "  fix: give another --port, or leave it out for a free one") from None
    return sock


def serve(port: int = 0, *, announce: Callable[[str], None] = print,
          home: Path | None = None) -> None:
    """Serve the viewer on ``127.0.0.1:port`` (0: a free port) under a random path prefix
    until interrupted; the URL with this launch's prefix and token goes to ``announce`` once
    the run list is indexed, before the first request can arrive."""
    import uvicorn

    sock = listen(port)  # connections queue from now on, so the printed URL works at once
    bound = sock.getsockname()[1]
    prefix = "/" + secrets.token_urlsafe(PREFIX_BYTES)
    # built and warmed before the URL is printed: no request waits
    app, token = build(home, port=bound, warm=True, prefix=prefix)
    config = uvicorn.Config(app, log_level="warning", access_log=False,  # type: ignore[arg-type]
                            server_header=False, date_header=False)
    server = uvicorn.Server(config)
    announce(f"http://{HOST}:{bound}{prefix}/?token={token}")
    server.run(sockets=[sock])
