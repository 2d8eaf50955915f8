"""``BrokerSigner``: a ``Signer`` whose key lives in the broker process.

It has the same ``key_id``, ``public_key`` and ``sign(bytes) -> str`` as an in-process
``Signer``, so ``mint``, head records and every other caller use it unchanged. Requests are
serialised with a lock (one channel, many threads); a fork of this process gets its own
broker, never a share of the parent's channel.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import threading
from pathlib import Path

from choir.exceptions import IntegrityError, SigningRefused
from choir.trusted.protocol import Reply, Request, recv, recv_with_fd, send

HELLO_DEADLINE_S = 30.0
"""How long a client waits for the broker's ``hello``: loading (or making) the key takes
milliseconds."""


class BrokerSigner:
    """The client end of one broker. ``key_id`` and ``public_key`` are asked for on first
    use, so the broker loads the key while its parent gets on; they raise
    ``IntegrityError`` when the broker cannot load it (its message says why and the fix)."""

    def __init__(self, home: Path, pid: int, sock: socket.socket,
                 hello: Reply | None = None) -> None:
        self.home, self.pid = home, pid
        self._sock: socket.socket | None = sock
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._hello = hello  # the key already told (a fork adopting a copy of its broker)
        self.refusal = ""  # why the broker last would not say its key (``usable``)

    def __repr__(self) -> str:
        return f"BrokerSigner(home={str(self.home)!r}, pid={self.pid})"

    def _key(self) -> Reply:
        if self._hello is None:
            try:
                self._hello = self._ask(Request(op="hello"))
            except IntegrityError:
                self.close()
                raise
        return self._hello

    @property
    def key_id(self) -> str:
        """The key id of the broker's key."""
        return self._key().key_id

    @property
    def public_key(self) -> str:
        """Base64 of the broker's raw 32-byte public key."""
        return self._key().public_key

    def _ask(self, request: Request) -> Reply:
        with self._lock:
            if self._sock is None:
                raise IntegrityError("the signing broker was closed")
            # a ``hello`` (the first loads the key) answers at once: a broker stuck on a
            # planted file must not hang its client (review 21, F2); a signature may
            # re-hash evidence first, and has no deadline
            self._sock.settimeout(HELLO_DEADLINE_S if request.op == "hello" else None)
            try:
                send(self._sock, request)
                raw = recv(self._sock)
            except TimeoutError:
                self._abandon()
                raise IntegrityError(
                    f"the signing broker (pid {self.pid}) did not answer within "
                    f"{HELLO_DEADLINE_S:g} s: is a file in {self.home / 'keys'} a FIFO, or "
                    "its disk hung?\n  fix: make ed25519.key and ed25519.pub plain files "
                    "(or remove ed25519.pub: it is written again)") from None
            except (OSError, ValueError) as err:
                raw, why = None, str(err)
            else:
                why = "it closed the channel"
            finally:
                if self._sock is not None:
                    self._sock.settimeout(None)
        if raw is None:
            raise IntegrityError(f"the signing broker (pid {self.pid}) is gone: {why}")
        reply = Reply.model_validate(raw)
        if reply.ok:
            return reply
        if reply.kind == "key":
            raise IntegrityError(reply.error)
        if reply.kind == "stale":  # rotated: the next ``key_id`` asks for the new key
            self._hello = None
            raise IntegrityError(reply.error)
        raise SigningRefused(f"the signing broker refused: {reply.error}")

    def _abandon(self) -> None:
        """Give up on a broker that did not answer (the lock held): a late reply would
        answer the next request, so the channel is closed and the broker, stuck where
        closing cannot wake it, killed and reaped."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if os.getpid() == self._owner:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)

    def sign(self, data: bytes) -> str:
        """Base64 ed25519 signature of ``data``, made by the broker after its checks.

        Raises:
            SigningRefused: ``data`` is not a Choir object the broker signs.
            IntegrityError: the key was rotated since ``key_id`` was read (``data`` was
                built for the old key; nothing is signed), or the broker cannot sign.
        """
        return self._ask(Request(op="sign", data=base64.b64encode(data).decode("ascii"))
                         ).signature

    def channel(self) -> tuple[int, socket.socket]:
        """A broker of its own for a fork of this process: its pid and channel (a copy of
        this broker, ``choir.trusted.broker._channel``). The fork adopts it with
        ``choir.trusted.adopt``; this process closes its copy of the socket after the fork.

        Raises:
            IntegrityError: the broker cannot load the key, or is gone.
        """
        with self._lock:
            if self._sock is None:
                raise IntegrityError("the signing broker was closed")
            try:
                send(self._sock, Request(op="channel"))
                raw, fd = recv_with_fd(self._sock)
            except (OSError, ValueError) as err:
                raise IntegrityError(f"the signing broker (pid {self.pid}) is gone: {err}"
                                     ) from err
        reply = Reply.model_validate(raw) if raw is not None else None
        if reply is None or not reply.ok or fd is None:
            if fd is not None:
                os.close(fd)
            raise IntegrityError(reply.error if reply is not None else
                                 f"the signing broker (pid {self.pid}) is gone")
        return reply.pid, socket.socket(fileno=fd)

    def usable(self, *, same_key: bool = True) -> bool:
        """True while the channel is open, this is the process that opened it, and the
        broker holds a key: after ``choir keys rotate`` it loads the new one, and the answer
        is then False unless ``same_key`` is off (a confined command goes on with the new
        key; ``choir serve``'s worker, warmed under the old one, is stale)."""
        if self._sock is None or os.getpid() != self._owner:
            return False
        try:
            hello = self._ask(Request(op="hello"))  # the key it holds now
        except IntegrityError as err:
            self.refusal = str(err)
            return False
        if same_key and self._hello is not None and self._hello.key_id != hello.key_id:
            return False  # this client keeps saying the key it was told
        self._hello = hello
        return True

    def close(self) -> None:
        """Close the channel; the broker exits and is reaped. In a fork, only the fork's copy
        of the channel is closed (the broker serves the process that started it)."""
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is None:
            return
        sock.close()
        if os.getpid() != self._owner:
            return
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
