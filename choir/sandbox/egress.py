"""The egress proxy: the only way out of a sandbox whose step has a host list (``hosts:``).

The step keeps its own network namespace, with loopback only: no route, no DNS, no raw
socket. A folder holding one Unix socket is bound into the sandbox read-only; a forwarder
inside (``_forwarder.py``) listens on ``127.0.0.1`` and relays each connection to it, with
``HTTP(S)_PROXY`` pointing there. This module is the other end, in Choir's process on the
host: an HTTP proxy (``CONNECT host:port`` for TLS, absolute-form requests for plain HTTP)
that lets through only the listed ``host:port`` pairs (``choir._core.hosts``).

Why each rule, as an attacker would try it:

- The proxy resolves a name itself and connects to the address it checked, so nothing
  inside can resolve anything, and a listed name cannot be rebound to another address
  between the check and the connection.
- A listed name that resolves to a loopback, link-local (cloud metadata), unspecified,
  multicast or reserved address is refused: a DNS answer must not reach the host's own
  services or ``169.254.169.254``. Only an IP literal the user listed (``127.0.0.1:8080``)
  or ``localhost`` reaches loopback, and then only at the listed port.
- The proxy listens on no TCP port at all: there is nothing of its own to CONNECT to.
  A request in origin form (``GET / HTTP/1.1``, addressed to the proxy itself) is refused.
- Plain HTTP goes out with ``Host:`` set to the listed authority and ``Connection: close``:
  a ``Host:`` header naming another site cannot turn an allowed connection into a request
  for it (virtual hosting), and keep-alive cannot carry a second request elsewhere.
- Userinfo (``http://allowed@evil/``), numeric host spellings and IPv6 zone ids are
  refused before any lookup.

What it cannot stop: what a step sends to a listed host, and where that host forwards it;
inside TLS (``CONNECT``) it sees no ``Host`` or SNI, so one TLS front serving many names
(domain fronting) is as open as the listed name is (docs/security.md, "Egress").
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import shutil
import socket
import tempfile
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from choir._core.hosts import HostPort, parse_host
from choir.sandbox.base import ExecResult, Sink

SOCKET_NAME = "proxy.sock"
MOUNT = "/.choir-egress"  # where the socket folder is bound inside every sandbox
# the host's own interpreter, when the sandbox shows the host's /usr: a fixed path, never a
# PATH lookup (a pyenv shim is a bash script: 200 ms instead of 30 before the step starts)
SYSTEM_PYTHON = "/usr/bin/python3"
HEAD_MAX = 32 * 1024
HEAD_TIMEOUT_S = 20.0
CONNECT_TIMEOUT_S = 15.0
MAX_CONNECTIONS = 64  # per step: two descriptors each in Choir's process, whatever the step opens
SUMMARY_LINES = 40
_HOP_BY_HOP = {"connection", "proxy-connection", "keep-alive", "proxy-authorization",
               "proxy-authenticate", "te", "trailer", "upgrade", "host"}

Resolver = Callable[[str, int], Awaitable[list[str]]]


class Refused(Exception):
    """A request the proxy will not carry: ``status`` and a reason safe to show the step."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Request:
    """What a step asked for: ``head`` is what goes upstream (None for CONNECT)."""

    method: str
    target: HostPort
    head: bytes | None


def parse_request(head: bytes) -> Request:
    """The endpoint and upstream head of one proxy request.

    Raises:
        Refused: anything but ``CONNECT host:port`` or an ``http://`` absolute-form request.
    """
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise Refused(400, "the request head is not ASCII") from None
    lines = text.split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        # a bare CR or LF ends a header line for some servers and not for others: a second
        # request or header smuggled past this parse
        raise Refused(400, "a bare CR or LF in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
        raise Refused(400, "not an HTTP/1.x request line")
    method, target, version = parts
    if method == "CONNECT":
        if "@" in target or "/" in target:
            raise Refused(400, "CONNECT takes host:port only")
        return Request(method, _endpoint(target, default_port=None), None)
    if not target.lower().startswith("http://"):
        # origin form addresses the proxy itself, which serves nothing; https:// in a
        # plain request would have the proxy speak TLS for the step: CONNECT is for that
        raise Refused(400, "send CONNECT host:port, or an absolute http:// URL")
    rest = target[len("http://"):]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:] or "/"
    if "@" in authority:
        raise Refused(400, "a user in the URL is refused")
    if not path.startswith("/"):
        path = "/" + path
    endpoint = _endpoint(authority, default_port=80)
    dropped = _HOP_BY_HOP | _named(lines)
    headers = [line for line in lines[1:]
               if line and line.split(":", 1)[0].strip().lower() not in dropped]
    host_header = str(endpoint).removesuffix(":80") if endpoint.port == 80 else str(endpoint)
    upstream = "\r\n".join([f"{method} {path} {version}", *headers, f"Host: {host_header}",
                            "Connection: close", "", ""])
    return Request(method, endpoint, upstream.encode("ascii"))


def _named(lines: list[str]) -> set[str]:
    """Headers a ``Connection:`` header names as hop-by-hop (dropped with it)."""
    named: set[str] = set()
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "connection":
            named |= {v.strip().lower() for v in value.split(",")}
    return named


def _endpoint(authority: str, *, default_port: int | None) -> HostPort:
    try:
        return parse_host(authority, default_port=default_port)
    except ValueError:
        raise Refused(400, "not a host:port Choir accepts (a name, or an IP literal; no "
                           "numeric host spellings)") from None


def refused_address(address: str, entry: HostPort) -> str | None:
    """Why a connection to ``address`` for the listed ``entry`` is refused, or None."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    ip = mapped or ip
    if entry.ip:
        return None if ip == ipaddress.ip_address(entry.host) else "not the listed address"
    if entry.host == "localhost":
        return None if ip.is_loopback else "localhost resolved off loopback"
    if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast \
            or ip.is_reserved or (ip.version == 4 and ip in _THIS_NETWORK):
        return f"{entry.host} resolved to {ip}, which a name on the list may not reach"
    return None


_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")


def _short_tmp() -> str:
    """A temp folder whose socket path fits ``sun_path`` (108 bytes): ``TMPDIR`` when short
    enough (a deep per-test or per-job TMPDIR is not), else ``/tmp``."""
    for folder in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        if len(f"{folder}/choir-egress-12345678/{SOCKET_NAME}") < 100 and os.path.isdir(folder):
            return folder
    raise OSError("no temp folder short enough for a Unix socket path")


async def _system_resolve(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass
class EgressProxy:
    """The host side of one step's egress: ``with EgressProxy(hosts) as proxy: ...``.

    ``socket_dir`` is the folder to bind at ``MOUNT`` inside the sandbox. ``resolve`` is for
    tests (a name that rebinds to loopback); the default asks the system resolver.
    """

    hosts: Iterable[str]
    resolve: Resolver = _system_resolve
    allowed: frozenset[HostPort] = field(init=False)
    socket_dir: Path = field(init=False)
    decisions: Counter[tuple[str, str, str]] = field(init=False, default_factory=Counter)

    def __post_init__(self) -> None:
        self.allowed = frozenset(parse_host(h) for h in self.hosts)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._lock = threading.Lock()

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / SOCKET_NAME

    def start(self) -> None:
        """Bind the socket (any local user may connect: the sandbox's is ``nobody``) and serve.

        Raises:
            OSError: the folder or the socket could not be made.
        """
        self.socket_dir = Path(tempfile.mkdtemp(prefix="choir-egress-", dir=_short_tmp()))
        os.chmod(self.socket_dir, 0o755)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.socket_path))
            os.chmod(self.socket_path, 0o666)
            sock.listen(MAX_CONNECTIONS)
        except OSError:
            sock.close()
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            raise
        loop = asyncio.new_event_loop()
        self._loop = loop
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)

            async def open_server() -> None:
                self._server = await asyncio.start_unix_server(self._accept, sock=sock,
                                                               limit=HEAD_MAX)
            loop.run_until_complete(open_server())
            started.set()
            loop.run_forever()

        self._thread = threading.Thread(target=serve, name="choir-egress", daemon=True)
        self._thread.start()
        started.wait(10)

    def stop(self) -> None:
        """Close the socket and every connection it carried; remove the folder."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            async def shutdown() -> None:
                if self._server is not None:
                    self._server.close()
                for task in list(self._tasks):
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        if loop is not None and not loop.is_running():
            loop.close()
        self._loop = self._thread = None
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def summary(self) -> list[str]:
        """One line per distinct decision, with a count: what the step's log shows."""
        with self._lock:
            items = sorted(self.decisions.items())
        lines = [f"[choir] egress {verdict} {what}: {why}" + (f" (x{n})" if n > 1 else "")
                 for (verdict, what, why), n in items[:SUMMARY_LINES]]
        if len(items) > SUMMARY_LINES:
            lines.append(f"[choir] egress: {len(items) - SUMMARY_LINES} more kinds of request")
        return lines

    def _note(self, verdict: str, what: str, why: str) -> None:
        with self._lock:
            if len(self.decisions) < 1000 or (verdict, what, why) in self.decisions:
                self.decisions[(verdict, what, why)] += 1

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self._slots.locked():
                await _answer(reader, writer, 503, "too many connections at once")
                return
            async with self._slots:
                await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # the proxy is stopping: the step has ended; the writer closes below
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            request = parse_request(head)
        except (asyncio.LimitOverrunError, ValueError):
            self._note("refused", "a request", "its head is over 32 KiB")
            return await _answer(reader, writer, 431, "the request head is too large")
        except TimeoutError:
            return None
        except Refused as refused:
            self._note("refused", "a request", refused.reason)
            return await _answer(reader, writer, refused.status, refused.reason)
        what = f"{request.method} {request.target}"
        if request.target not in self.allowed:
            self._note("refused", what, "not on the host list")
            listed = ", ".join(map(str, sorted(self.allowed)))
            return await _answer(reader, writer, 403, f"{request.target} is not on this "
                                                      f"step's host list ({listed})")
        try:
            up_reader, up_writer = await self._connect(request.target)
        except Refused as refused:
            self._note("refused", what, refused.reason)
            return await _answer(reader, writer, refused.status, refused.reason)
        self._note("allowed", what, "on the host list")
        try:
            if request.head is None:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_writer.write(request.head)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()

    async def _connect(self, target: HostPort) -> tuple[asyncio.StreamReader,
                                                         asyncio.StreamWriter]:
        """A connection to an address ``target`` may reach, resolved and checked here."""
        try:
            addresses = [target.host] if target.ip else \
                await asyncio.wait_for(self.resolve(target.host, target.port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            raise Refused(502, f"{target.host} did not resolve") from None
        reasons = [why for why in (refused_address(a, target) for a in addresses) if why]
        usable = [a for a in addresses if refused_address(a, target) is None]
        if not usable:
            raise Refused(403, reasons[0] if reasons else f"{target.host} has no address")
        for address in usable:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, target.port,
                                            flags=socket.AI_NUMERICHOST),
                    CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                continue
        raise Refused(502, f"{target} did not accept the connection")


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then half-close ``sink`` so replies still flow back."""
    try:
        while chunk := await source.read(1 << 16):
            sink.write(chunk)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (OSError, RuntimeError):
        sink.close()


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int,
                  reason: str) -> None:
    """A short plain-text reply the step's HTTP client can show; then the connection ends.

    What the client sent beyond the head is read and dropped for up to a second first: a
    socket closed with unread bytes is reset, and the client would see the reset instead
    of the reason.
    """
    phrase = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large",
              502: "Bad Gateway", 503: "Service Unavailable"}.get(status, "Error")
    body = f"choir egress: {reason}\n".encode("ascii", "replace")
    writer.write(f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n"
                 f"X-Choir-Egress: refused\r\n\r\n".encode() + body)
    with contextlib.suppress(OSError, TimeoutError, asyncio.LimitOverrunError, ValueError):
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(1.0):
            while await reader.read(1 << 16):
                pass


def with_egress(hosts: Sequence[str], sink: Sink,
                run: Callable[[EgressProxy | None], ExecResult]) -> ExecResult:
    """``run(proxy)`` with a proxy for ``hosts`` serving meanwhile (None: no list), then the
    proxy's decisions appended to the step's log. A proxy that cannot start is the
    sandbox's failure (INCONCLUSIVE), never a step that ran without its list."""
    if not hosts:
        return run(None)
    proxy = EgressProxy(hosts)
    try:
        proxy.start()
    except OSError as exc:
        return ExecResult(-1, 0, infra_error=f"the egress proxy could not start: {exc}")
    try:
        result = run(proxy)
    finally:
        proxy.stop()
    for line in proxy.summary():
        sink(f"\n{line}\n".encode())
    return result


def forwarder_source() -> str:
    """The in-sandbox forwarder's source, passed with ``-c`` (no file to bind or plant)."""
    from importlib import resources

    return (resources.files("choir.sandbox") / "_forwarder.py").read_text("utf-8")


def wrap(proxy: EgressProxy, argv: list[str], python: str = "python3") -> list[str]:
    """``argv`` run by the forwarder: the proxy port in its environment, and a tunnel on the
    same port for each listed loopback endpoint (``127.0.0.1:PORT``, ``localhost:PORT``).

    ``python``: the sandbox's interpreter for it; any Python 3 works (stdlib only, ``-S``).
    """
    tunnels: list[list[object]] = []
    taken: set[tuple[str, int]] = set()
    for hp in sorted(proxy.allowed):
        if hp.host == "localhost":
            local = ("127.0.0.1", hp.port)
        elif hp.ip and ":" not in hp.host and ipaddress.ip_address(hp.host).is_loopback:
            local = (hp.host, hp.port)
        else:
            local = ("127.0.0.1", 0)  # a free port, named in CHOIR_EGRESS_TUNNELS
        if local[1] == 0 or local not in taken:
            taken.add(local)
            tunnels.append([*local, str(hp)])
    return [python, "-I", "-S", "-c", forwarder_source(), f"{MOUNT}/{SOCKET_NAME}",
            json.dumps(tunnels), *argv]
