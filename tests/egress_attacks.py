"""The egress attacks a hostile step tries, as one program run inside the sandbox.

``Target`` holds the host side: an allowed HTTP server (``A``: ``/hello``, ``/redirect`` to
the secret server, ``/echo-host``) and a secret server (``S``, on every address of the host)
that counts every connection it gets. ``probe_program`` writes the program that tries each
way out (by name, by IP literal, through DNS, a raw socket, another loopback port, the
proxy's own socket, a redirect, a forged ``Host:``, userinfo, a second request smuggled in
an allowed tunnel) and exits 0 only when every attack was blocked and the allowed request
(when ``allowed`` is expected) went through. It prints one line per probe either way.
"""

from __future__ import annotations

import subprocess
import textwrap
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import BaseRequestHandler, ThreadingTCPServer
from typing import Any


def host_address() -> str | None:
    """This machine's first non-loopback IPv4 address (the sandbox must not reach it)."""
    try:
        words = subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                               timeout=5).stdout.split()
    except OSError:
        return None
    return next((w for w in words if "." in w and not w.startswith("127.")), None)


@dataclass
class Target:
    """The allowed server ``allowed`` and the secret one ``secret`` (ports), both started."""

    allowed: int = 0
    secret: int = 0
    secret_hits: list[bytes] = field(default_factory=list)
    hosts_seen: list[str] = field(default_factory=list)
    paths_seen: list[str] = field(default_factory=list)

    def __enter__(self) -> Target:
        owner = self

        class Allowed(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                owner.paths_seen.append(self.path)
                owner.hosts_seen.append(self.headers.get("Host", ""))
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.1:{owner.secret}/stolen")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = (self.headers.get("Host", "") if self.path == "/echo-host"
                        else "allowed-ok" if self.path == "/hello" else "not-found").encode()
                self.send_response(200 if self.path in ("/hello", "/echo-host") else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Secret(BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(2)
                try:
                    data = self.request.recv(4096)
                except OSError:
                    data = b""
                owner.secret_hits.append(data or b"<connected>")
                self.request.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nSECRET")

        ThreadingTCPServer.allow_reuse_address = True
        self._allowed = ThreadingHTTPServer(("127.0.0.1", 0), Allowed)
        self._secret = ThreadingTCPServer(("0.0.0.0", 0), Secret)
        self.allowed = int(self._allowed.server_address[1])
        self.secret = int(self._secret.server_address[1])
        for server in (self._allowed, self._secret):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in (self._allowed, self._secret):
            server.shutdown()
            server.server_close()


PROGRAM = r'''
import json, os, socket, sys, urllib.error, urllib.request

A, S, HOST_IP, EXPECT_ALLOWED = {allowed}, {secret}, {host_ip!r}, {expect_allowed!r}
PROXY = os.environ.get("HTTP_PROXY", "")
SOCK = "/.choir-egress/proxy.sock"
results = {{}}


def attempt(name, blocked_when, fn):
    try:
        outcome = fn()
    except Exception as exc:
        outcome = "error: " + type(exc).__name__ + ": " + str(exc)[:120]
    results[name] = (blocked_when(outcome), outcome)


def raw(address, payload, family=socket.AF_INET, timeout=5):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(address)
        s.sendall(payload)
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data.decode("latin-1")
    finally:
        s.close()


def via_proxy(payload):
    if not PROXY:
        raise OSError("no proxy")
    host, port = PROXY.rsplit("/", 1)[-1].rsplit(":", 1)
    return raw((host, int(port)), payload)


def status(reply):
    return reply.split("\r\n", 1)[0]


refused = lambda out: out.startswith("error") or " 200 " not in status(out) + " "
not_secret = lambda out: "SECRET" not in out

# the allowed request: through the proxy and through the forwarder's loopback tunnel
def allowed():
    return urllib.request.urlopen(f"http://127.0.0.1:{{A}}/hello", timeout=10).read().decode()
attempt("allowed", lambda out: out != "allowed-ok", allowed)
attempt("allowed_via_proxy", lambda out: "allowed-ok" not in out,
        lambda: via_proxy(f"GET http://127.0.0.1:{{A}}/hello HTTP/1.1\r\nHost: x\r\n\r\n".encode()))
# by name
attempt("name_connect", refused,
        lambda: via_proxy(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n"))
attempt("name_get", refused,
        lambda: via_proxy(b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n"))
# by IP literal: another loopback port, the host's own address, numeric spellings
attempt("loopback_port_via_proxy", refused,
        lambda: via_proxy(f"GET http://127.0.0.1:{{S}}/ HTTP/1.1\r\n\r\n".encode()))
attempt("loopback_connect_via_proxy", refused,
        lambda: via_proxy(f"CONNECT 127.0.0.1:{{S}} HTTP/1.1\r\n\r\n".encode()))
attempt("numeric_spelling_via_proxy", refused,
        lambda: via_proxy(f"CONNECT 2130706433:{{S}} HTTP/1.1\r\n\r\n".encode()))
attempt("short_spelling_via_proxy", refused,
        lambda: via_proxy(f"CONNECT 127.1:{{A}} HTTP/1.1\r\n\r\n".encode()))
if HOST_IP:
    attempt("host_ip_via_proxy", refused,
            lambda: via_proxy(f"CONNECT {{HOST_IP}}:{{S}} HTTP/1.1\r\n\r\n".encode()))
    attempt("host_ip_direct", not_secret,
            lambda: raw((HOST_IP, S), b"GET / HTTP/1.0\r\n\r\n", timeout=3))
attempt("loopback_direct", not_secret,
        lambda: raw(("127.0.0.1", S), b"GET / HTTP/1.0\r\n\r\n", timeout=3))
# DNS, then a raw socket
attempt("dns_lookup", lambda out: out.startswith("error"),
        lambda: str(socket.getaddrinfo("example.com", 443)))
def dns_udp():
    resolver = "10.255.255.53"
    for line in open("/etc/resolv.conf"):
        if line.startswith("nameserver"):
            resolver = line.split()[1]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01",
             (resolver, 53))
    return repr(s.recvfrom(512))
attempt("dns_udp", lambda out: out.startswith("error"), dns_udp)
attempt("raw_icmp", lambda out: out.startswith("error"),
        lambda: str(socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)))
attempt("raw_packet", lambda out: out.startswith("error"),
        lambda: str(socket.socket(socket.AF_PACKET, socket.SOCK_RAW)))
# the proxy's own socket: addressed to itself, or to the forwarder's port
def control(payload):
    return raw(SOCK, payload, family=socket.AF_UNIX)
attempt("proxy_itself", refused, lambda: control(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
if PROXY:
    forwarder = PROXY.rsplit(":", 1)[-1]
    attempt("proxy_forwarder_port", refused,
            lambda: control(f"CONNECT 127.0.0.1:{{forwarder}} HTTP/1.1\r\n\r\n".encode()))
# a redirect from the allowed host to the secret one, followed through the proxy
def redirect():
    os.environ.pop("NO_PROXY", None)
    os.environ.pop("no_proxy", None)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({{"http": PROXY}}))
    return opener.open(f"http://127.0.0.1:{{A}}/redirect", timeout=10).read().decode()
attempt("redirect", not_secret, redirect)
# exfiltration through the allowed proxy: a forged Host, userinfo, a smuggled request
attempt("forged_host", lambda out: f"127.0.0.1:{{S}}" not in out,
        lambda: via_proxy(f"GET http://127.0.0.1:{{A}}/echo-host HTTP/1.1\r\n"
                          f"Host: 127.0.0.1:{{S}}\r\n\r\n".encode()))
attempt("userinfo", refused,
        lambda: via_proxy(f"GET http://127.0.0.1:{{A}}@127.0.0.1:{{S}}/ HTTP/1.1\r\n\r\n".encode()))
attempt("smuggled_in_tunnel", not_secret,
        lambda: via_proxy(f"CONNECT 127.0.0.1:{{A}} HTTP/1.1\r\n\r\n"
                          f"GET http://127.0.0.1:{{S}}/ HTTP/1.1\r\nHost: 127.0.0.1:{{S}}\r\n"
                          "Connection: close\r\n\r\n".encode()))

wrong = []
for name, (blocked, outcome) in sorted(results.items()):
    expected = not (name.startswith("allowed") and EXPECT_ALLOWED)
    ok = blocked == expected
    print(("ok   " if ok else "FAIL ") + name + ": " + outcome.replace("\r\n", " | ")[:200])
    if not ok:
        wrong.append(name)
print("EGRESS-PROBES " + json.dumps(sorted(wrong)))
sys.exit(1 if wrong else 0)
'''


def probe_program(target: Target, *, expect_allowed: bool) -> str:
    """The program's source, for a file the step runs with ``python3``."""
    return textwrap.dedent(PROGRAM).format(allowed=target.allowed, secret=target.secret,
                                           host_ip=host_address(),
                                           expect_allowed=expect_allowed)


def write_probe(folder: Path, target: Target, *, expect_allowed: bool) -> Path:
    path = folder / "probe.py"
    path.write_text(probe_program(target, expect_allowed=expect_allowed))
    path.chmod(0o644)
    return path
