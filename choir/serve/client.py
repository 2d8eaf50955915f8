"""The client end: ask a running service, or say why not (the caller then runs cold).

``choir verify`` and ``choir run`` call ``Call.start`` before anything else (``choir.cli``'s
entry, with the command line as typed). The service is
used only when it is provably this user's and current: the folder and the socket pass
``choir.serve.place``'s checks, the process listening is this user's (``SO_PEERCRED``, so a
socket another user planted is never spoken to), and it takes the request rather than
answering ``stale`` or ``refused``. Any of those failing, or no service at all, returns
None with the reason, and the command runs cold, so the answer is the same either way.
A worker that takes the request runs the command on this process's own descriptors (its
working directory, root, mount namespace, stdin, stdout and stderr travel with the
request), so the terminal shows exactly what the cold command prints, live view included,
and the client only waits for the exit code. After ``started`` there is no way back (the
service may have begun recording evidence): a connection lost then is ``Lost``, reported
as a failure.

``CHOIR_SERVE`` chooses: ``auto`` (the default: use a service when one answers), ``off``
(never ask), ``require`` (exit 2 when none answers, saying why: for scripts and benchmarks
that must not measure the cold path by accident).

Standard library only, and only its light modules (no ``dataclasses``, whose ``inspect``
costs a warm command 12 ms; no ``json``, ``socket`` or ``pathlib``, which bring ``re``,
``enum``, ``selectors``, ``urllib`` and ``ipaddress``: ``choir._core.wirejson``, ``_socket``
and plain path strings instead), as it runs before the command knows whether it needs
anything more.
"""

from __future__ import annotations

import _socket
import os
import struct
import sys

from choir._core import frames, wirejson
from choir._core.errors import UserError
from choir._version import __version__
from choir.serve import place, stale

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (2-8 ms on the warm
# path of `choir verify`); mypy reads any TYPE_CHECKING as true
if TYPE_CHECKING:
    from os import PathLike
    from typing import Any

ENV = "CHOIR_SERVE"
MODES = ("auto", "off", "require")
FIRST_REPLY_S = 10.0
MAX_ANSWER = 64 << 10  # the service says only short things: queued, started, exit, why not
_CREDS = struct.Struct("3i")


class Lost(Exception):
    """The service stopped answering after it had taken the request."""


def mode() -> str:
    """``CHOIR_SERVE``'s value, checked.

    Raises:
        UserError: it is none of ``auto``, ``off``, ``require``.
    """
    value = os.environ.get(ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise UserError(f"{ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def connect(home: str | PathLike[str]) -> tuple[_socket.socket | None, str]:
    """A connection to ``home``'s service, or None and why not."""
    try:
        fd = place.open_folder(home, create=False)
        if fd is None:
            return None, "no service runs for this CHOIR_HOME (`choir serve` starts one)"
        try:
            if not place.check_socket(fd):
                return None, "no service runs for this CHOIR_HOME (`choir serve` starts one)"
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
            try:
                sock.connect(place.socket_address(fd))
            except OSError:
                sock.close()
                return None, "the service is gone (its socket file is left over)"
        finally:
            os.close(fd)
    except UserError as exc:
        return None, f"not using the service: {exc}"
    _, uid, _ = _CREDS.unpack(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED,
                                              _CREDS.size))
    if uid != os.geteuid():
        sock.close()
        return None, f"not using the service: its socket is served by uid {uid}, not you"
    return sock, ""


def context() -> dict[str, Any]:
    """Where this process stands (``choir.serve.wire.Context``): its process standing and
    resource limits too (``choir.serve.stale``; two ``/proc`` files and fifteen system
    calls, under 1 ms measured)."""
    umask = os.umask(0)
    os.umask(umask)
    return {"version": __version__, "code": stale.code(), "cwd": os.getcwd(), "umask": umask,
            "environ": dict(os.environ), "standing": stale.standing(),
            "rlimits": stale.rlimits()}


def _message(sock: _socket.socket) -> dict[str, Any] | None:
    try:
        data = frames.recv(sock, MAX_ANSWER)
        message = wirejson.loads(data) if data is not None else None
    except (OSError, ValueError):
        return None
    return message if isinstance(message, dict) and len(message) == 1 else None


class Call:
    """One request a worker took; it answers with the command's exit code."""

    def __init__(self, sock: _socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid

    @classmethod
    def start(cls, home: str | PathLike[str], request: dict[str, Any],
              stdio: tuple[int, int, int] = (0, 1, 2),
              mounts: int | None = None) -> tuple[Call | None, str]:
        """Send ``request`` (``choir.serve.wire``'s fields) with this process's working
        directory, root, mount namespace (``mounts``: a descriptor of another, the one a
        confined caller started in) and ``stdio`` (what the command reads and prints on),
        and wait until a worker takes it; None and why when no service does (the caller
        runs cold)."""
        sock, why = connect(home)
        if sock is None:
            return None, why
        try:
            envelope = wirejson.dumps({"context": context(), "request": request})
            cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC) \
                if mounts is None else os.dup(mounts)
            try:
                frames.send(sock, envelope, (cwd, root, ns))
            finally:
                os.close(cwd)
                os.close(root)
                os.close(ns)
        except OSError as exc:
            sock.close()
            return None, f"the service did not take the request ({exc.strerror or exc})"
        sock.settimeout(FIRST_REPLY_S)  # a live service answers at once, if only `queued`
        while True:
            message = _message(sock)
            if message is None:
                sock.close()
                return None, ("the service did not take the request (it closed the "
                              f"connection, or said nothing for {FIRST_REPLY_S:g} s)")
            if "ready" in message:  # taken: now the streams, never before (worker.answer)
                try:
                    frames.send(sock, b"{}", stdio)
                except OSError:
                    pass  # then the next read finds the connection gone
                continue
            if "started" in message:
                sock.settimeout(None)
                return cls(sock, int(message["started"].get("pid", 0))), ""
            if "queued" in message:
                sock.settimeout(None)  # every worker is busy: its turn comes
                continue
            sock.close()
            for key in ("stale", "refused"):
                if key in message:
                    return None, f"the service is {key}: {str(message[key])[:2000]}"
            return None, "the service answered something this client does not understand"

    def wait(self) -> int:
        """The command's exit code, once the worker has run it.

        Raises:
            Lost: the connection ended first.
        """
        message = _message(self.sock)
        if message is None or not isinstance(message.get("exit"), int):
            raise Lost(f"the service's worker (pid {self.pid}) ended without an answer")
        return int(message["exit"])

    def stop(self) -> None:
        """Ask the worker to stop the sandboxes and conclude on what they did."""
        try:
            frames.send(self.sock, b'{"op": "stop"}')
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


def note(why: str) -> None:
    """Say on stderr why the service was not used, when that is worth saying (a stale or
    unsafe service; not its mere absence)."""
    if why and not why.startswith("no service runs"):
        sys.stderr.write(f"choir: running without `choir serve`: {why}\n")
        sys.stderr.flush()


__all__ = ["ENV", "Call", "Lost", "connect", "context", "mode", "note"]
