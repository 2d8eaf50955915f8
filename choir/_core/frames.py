"""Length-prefixed frames on a stream socket, optionally carrying file descriptors.

The signing broker's channel (``choir.trusted.protocol``) and the warm service's socket
(``choir.serve``) speak the same framing: a 4-byte big-endian length, then that many bytes.
A frame longer than the reader's bound is never read (the reader returns None, and its caller
hangs up), so a confused or hostile peer cannot make it buffer without bound. Descriptors
travel as ``SCM_RIGHTS`` with a frame's first bytes. Standard library only, and ``_socket``
rather than ``socket`` (whose ``enum`` and ``selectors`` cost the warm client 3-4 ms):
``choir verify`` imports this before it knows whether it needs anything heavier.
"""

from __future__ import annotations

import _socket
import os
import struct

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from socket import socket as Socket

HEADER = struct.Struct(">I")


def send(sock: _socket.socket, data: bytes, fds: tuple[int, ...] = ()) -> None:
    """Write one frame (and ``fds`` with it)."""
    frame = HEADER.pack(len(data)) + data
    if fds:
        sent = sock.sendmsg([frame], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                                       struct.pack(f"{len(fds)}i", *fds))])
        frame = frame[sent:]
    if frame:
        sock.sendall(frame)


def recv_exact(sock: _socket.socket, size: int) -> bytes | None:
    """Exactly ``size`` bytes, or None when the stream ends first."""
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def recv(sock: _socket.socket, most: int) -> bytes | None:
    """One frame's bytes; None at the end of the stream or when it is longer than ``most``."""
    header = recv_exact(sock, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > most:
        return None
    return recv_exact(sock, size)


def recv_with_fds(sock: Socket, most: int, max_fds: int) -> tuple[bytes | None, list[int]]:
    """One frame and the descriptors sent with it (at most ``max_fds``; any beyond are
    closed by the kernel's truncation). The caller owns every descriptor returned, also when
    the frame is None. (The receiving ends, the service and the broker, import ``socket``
    anyway.)"""
    import array
    import socket

    # close-on-exec as they arrive (``MSG_CMSG_CLOEXEC``, which ``socket.recv_fds`` drops
    # before 3.12): a program started later never inherits a signing channel or a client's
    # connection, whatever way it is started
    got = array.array("i")
    data, ancillary, flags, _ = sock.recvmsg(HEADER.size, socket.CMSG_LEN(max_fds * got.itemsize),
                                             socket.MSG_CMSG_CLOEXEC)
    for level, kind, body in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got.frombytes(body[:len(body) - len(body) % got.itemsize])
    fds = list(got)
    if flags & socket.MSG_CTRUNC:  # more descriptors than asked for: never trust the rest
        _close(fds)
        return None, []
    if not data:
        return None, fds
    rest = recv_exact(sock, HEADER.size - len(data)) if len(data) < HEADER.size else b""
    if rest is None:
        return None, fds
    (size,) = HEADER.unpack(data + rest)
    if size > most:
        return None, fds
    return recv_exact(sock, size), fds


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


__all__ = ["HEADER", "recv", "recv_exact", "recv_with_fds", "send"]
