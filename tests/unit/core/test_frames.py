"""Frames: bounded, and descriptors taken only in the number asked for."""

from __future__ import annotations

import os
import socket
import struct

from choir._core import frames


def test_a_frame_and_its_descriptors_arrive_together() -> None:
    a, b = socket.socketpair()
    with a, b:
        read, write = os.pipe()
        frames.send(a, b'{"x": 1}', (write,))
        os.close(write)
        data, fds = frames.recv_with_fds(b, 64, 1)
        assert data == b'{"x": 1}' and len(fds) == 1
        os.write(fds[0], b"through")  # the very pipe
        os.close(fds[0])
        assert os.read(read, 16) == b"through"
        os.close(read)


def test_more_descriptors_than_asked_for_refuse_the_frame() -> None:
    a, b = socket.socketpair()
    with a, b:
        null = os.open(os.devnull, os.O_RDONLY)
        frames.send(a, b"{}", (null, null, null))
        os.close(null)
        assert frames.recv_with_fds(b, 64, 2) == (None, [])


def test_an_oversized_frame_is_never_read() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", 1 << 30))
        assert frames.recv(b, 1024) is None
        a.sendall(struct.pack(">I", 10) + b"short")
        a.close()
        assert frames.recv(b, 1024) is None  # the stream ended inside the frame


def test_a_received_descriptor_is_never_inherited_by_a_program_started_later() -> None:
    """The broker's channel and a client's connection arrive as descriptors: one that stayed
    inheritable would reach any program started without ``close_fds`` (a plugin's, a
    library's), which could then sign, or write a forged exit code to the client."""
    import subprocess
    import sys

    a, b = socket.socketpair()
    with a, b:
        read, write = os.pipe()
        frames.send(a, b"{}", (write,))
        os.close(write)
        _data, [fd] = frames.recv_with_fds(b, 64, 1)
        assert os.get_inheritable(fd) is False
        child = subprocess.run([sys.executable, "-c", f"import os; os.write({fd}, b'x')"],
                               close_fds=False, capture_output=True)
        assert child.returncode != 0 and b"Bad file descriptor" in child.stderr
        os.close(fd)
        os.close(read)
