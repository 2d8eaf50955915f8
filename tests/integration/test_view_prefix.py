"""The viewer's token cookie stays with the viewer: served under a per-launch path prefix.

Cookies are not scoped by port, so a cookie set with ``Path=/`` by ``127.0.0.1:PORT`` goes
with every request the browser makes to any server on ``127.0.0.1``: a dev server, another
tool. Such a server learned the viewer's token and could read every page. The viewer serves
under ``/<prefix>/`` (random per launch) and scopes its cookie to that path; a request
outside the prefix is a 404 that never names it.
"""

from __future__ import annotations

import re
import socket
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests.viewhome import view_server


def _sent(jar: object, url: str) -> bool:
    """Whether the cookie jar (``http.cookiejar``, RFC 6265 path matching) sends a cookie
    with a request to ``url``."""
    request = urllib.request.Request(url)
    jar.add_cookie_header(request)  # type: ignore[attr-defined]
    return request.has_header("Cookie")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_token_cookie_is_sent_to_the_viewers_prefix_only(tmp_path: Path) -> None:
    with view_server(tmp_path / "home") as s:
        prefix = urlsplit(s.base).path
        with httpx.Client(follow_redirects=False, timeout=30) as c:
            answer = c.get(s.url)
            assert answer.status_code == 303 and answer.headers["location"] == f"{prefix}/"
            cookie = answer.headers["set-cookie"]
            assert f"Path={prefix}/;" in cookie + ";", cookie
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
            assert c.get(f"{s.base}/").status_code == 200  # the jar sends it to the viewer
            assert c.get(f"{s.base}/static/view.css").status_code == 200
            assert _sent(c.cookies.jar, f"{s.base}/ahdb")
            other = _free_port()
            for url in (f"http://127.0.0.1:{s.port}/", f"http://127.0.0.1:{s.port}/other/",
                        f"http://127.0.0.1:{other}/x", f"http://127.0.0.1:{other}/",
                        f"http://127.0.0.1:{other}{prefix}x/"):
                assert not _sent(c.cookies.jar, url), url
        assert re.fullmatch(r"/[A-Za-z0-9_-]{22,}", prefix), s.url  # >= 128 random bits


def test_a_request_outside_the_prefix_is_a_404_that_never_names_it(tmp_path: Path) -> None:
    with view_server(tmp_path / "home") as s:
        prefix = urlsplit(s.base).path
        secret = prefix.strip("/")
        origin = f"http://127.0.0.1:{s.port}"
        with httpx.Client(follow_redirects=False, timeout=30) as c:
            assert c.get(s.url).status_code == 303  # the cookie is in the jar
            cookie = {"cookie": f"choir_view_{s.port}={s.token}"}
            for path in ("/", f"/?token={s.token}", "/static/view.css", "/ahdb",
                         f"/x{prefix}/", f"{prefix}x/", f"{prefix[:-1]}/?token={s.token}",
                         f"/{secret.upper()}/?token={s.token}"):
                for headers in ({}, cookie):
                    answer = c.get(origin + path, headers=headers)
                    assert answer.status_code == 404, (path, answer.status_code)
                    assert secret not in answer.text and secret not in str(answer.headers)
            # the prefix alone (no slash) leads into it, but only for one who named it
            answer = c.get(f"{s.base}?token={s.token}")
            assert answer.status_code in (303, 307) and answer.headers["location"].startswith(
                f"{prefix}/")
