"""The broker: the one process that holds the signing key.

``spawn`` forks it from the caller before the caller touches any hostile byte (the child is
a copy of a process that has read nothing an executor or a step wrote), and the child reads
the key only after the fork, so the key never exists in the parent's memory. The child then:

- makes itself non-dumpable (``PR_SET_DUMPABLE`` 0): ``/proc/<pid>/mem``, ``environ``,
  ``root``, ``cwd`` and ``fd`` of the broker need ``CAP_SYS_PTRACE`` over it, which the
  confined parent gave up (``choir.trusted.confine``);
- keeps only its end of the socket pair (stdin, stdout and stderr go to ``/dev/null``);
- freezes the garbage collector and always leaves through ``os._exit``, so finalizers of
  objects copied from the parent (temporary folders, open stores) never run twice;
- answers typed, bounded requests (``choir.trusted.protocol``) after the checks of
  ``choir.trusted.checks``, records each signature in ``keys/signed.log`` first, and exits
  when the parent's end closes (the parent died or closed it), so it never outlives the
  process it serves;
- on ``channel``, forks a copy of itself on a new socket pair and hands the client that
  channel (``choir serve``'s workers: each request signs through a broker of its own).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import gc
import os
import signal
import socket
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pydantic.main
from pydantic import ValidationError

from choir._core.canonical import blake3_hex, canonical_json
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError, SigningRefused
from choir.models._base import build_deferred
from choir.trusted import checks
from choir.trusted.confine import non_dumpable
from choir.trusted.keyfile import KEY_FILE, Signer, load_key, open_keys
from choir.trusted.protocol import Reply, Request, recv, send

JOURNAL = "signed.log"


def _identity(keys_fd: int) -> tuple[int, ...] | None:
    """What changes when ``choir keys rotate`` replaces the key file in the folder."""
    try:
        st = os.stat(KEY_FILE, dir_fd=keys_fd, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mode, st.st_ctime_ns, st.st_mtime_ns, st.st_size


def _pin(home: Path) -> int | None:
    """The key folder of ``home`` as it is now (``None`` while there is none): ``spawn``
    takes it before the caller reads any hostile byte, and the broker never looks for
    another."""
    try:
        return open_keys(home, make=False)
    except OSError:
        return None


class _Held:
    """The key this broker signs with, loaded again whenever its file changes.

    ``choir keys rotate`` replaces the file while commands run; the broker (outside the
    caller's mask) sees it and loads the new key, so a confined caller, which cannot start
    another broker, goes on signing (review 23a, F2). ``announced`` is the key id the client
    was last told (on ``hello``, or the first load): a signature asked after the key
    changed was built for that id, so it is refused (``stale``), never made under a key the
    body does not name.

    The key is read only inside the folder pinned at start (``keys_fd``), never found again
    by path: a ``--sandbox local`` step, with main's uid, can move the home away (main's
    mask moves with it) and make another at its path holding a key it kept; loaded as a
    rotation, that key signed for the step (review 24a, F3). Once ``home/keys`` is not the
    pinned folder any more, the broker refuses everything (``lost``), ``hello`` included.
    """

    def __init__(self, home: Path, keys_fd: int | None = None) -> None:
        self.home, self.keys = home, home / "keys"
        self.keys_fd = keys_fd
        self.signer: Signer | None = None
        self.failure = ""
        self.identity: tuple[int, ...] | None = None
        self.announced = ""
        self.lost = False

    def current(self) -> None:
        """Load the key on the first request, and again when its file was replaced."""
        keys_fd = self.in_place()
        if keys_fd is None:
            return
        identity = _identity(keys_fd)  # taken before loading: a change after loads again
        if (self.signer is not None or self.failure) and identity == self.identity:
            return
        try:
            self.signer, self.failure = load_key(self.home, keys_fd), ""
        except (IntegrityError, OSError) as err:
            self.signer, self.failure = None, str(err)
        self.identity = identity
        if not self.announced and self.signer is not None:
            self.announced = self.signer.key_id

    def in_place(self) -> int | None:
        """The pinned folder while ``home/keys`` still leads to it (pinned now if there was
        none: a home made at first use), else ``None``, and nothing is signed again.

        ``home/keys`` is followed, as the mask over it was: a link to the pinned folder is
        that folder, and the key is read from the descriptor either way.
        """
        if self.lost:
            return None
        try:
            if self.keys_fd is None:
                self.keys_fd = open_keys(self.home)
            now, pinned = os.stat(self.keys), os.fstat(self.keys_fd)
            why = "" if (now.st_dev, now.st_ino) == (pinned.st_dev, pinned.st_ino) else \
                "another folder is there now"
        except OSError as err:
            why = err.strerror or str(err)
        if not why:
            return self.keys_fd
        self.lost, self.signer = True, None
        self.failure = (
            f"{self.keys} is no longer the key folder this signing broker started with "
            f"({why}): was {self.home} moved or replaced while the command ran (a step of "
            "a confined command can do that)? Nothing more is signed here.\n  fix: run the "
            f"command again, after checking that {self.home} is your home (`choir keys "
            "show` names its key)")
        return None


def answer(raw: dict[str, object], held: _Held, store: Callable[[], ArtifactStore]) -> Reply:
    """The reply to one request (never raises: a refusal is a reply)."""
    try:
        req = Request.model_validate(raw)
    except ValidationError as err:
        return Reply(ok=False, error=f"not a broker request: {err}"[:2000])
    signer = held.signer
    if signer is None:
        return Reply(ok=False, kind="key", error=held.failure[:2000])
    if req.op == "hello":
        held.announced = signer.key_id
        return Reply(ok=True, key_id=signer.key_id, public_key=signer.public_key)
    if signer.key_id != held.announced:
        return Reply(ok=False, kind="stale", error=(
            f"the signing key was rotated (`choir keys rotate`) from {held.announced} to "
            f"{signer.key_id} after this signer was asked for its key id: nothing was "
            "signed; build the object again (the signer now gives the new key id)"))
    try:
        data = base64.b64decode(req.data.encode("ascii"), validate=True)
        kind = checks.classify(data, store)
    except (binascii.Error, UnicodeEncodeError):
        return Reply(ok=False, error="data is not base64")
    except SigningRefused as err:
        return Reply(ok=False, error=str(err)[:2000])
    except Exception as err:  # noqa: BLE001 - no request ends the broker (review 18c)
        return Reply(ok=False, error=f"refused: the check failed: {type(err).__name__}")
    keys_fd = held.in_place()  # again: the checks read the home, which may have moved
    if keys_fd is None:
        return Reply(ok=False, kind="key", error=held.failure[:2000])
    try:
        _journal(keys_fd, signer.key_id, kind, data)
    except OSError as err:
        return Reply(ok=False, error=f"cannot record the signature in {JOURNAL}: {err}")
    return Reply(ok=True, kind=kind, signature=signer.sign(data))


def _journal(keys_fd: int, key_id: str, kind: str, data: bytes) -> None:
    """Append what is about to be signed to ``keys/signed.log`` (kind, blake3 of the bytes,
    time, key id), in the folder the main process cannot see: after a compromise of main,
    this lists every signature it obtained, so each can be judged and its key revoked."""
    line = canonical_json({"at": datetime.now(UTC).isoformat(timespec="milliseconds"),
                           "blake3": blake3_hex(data), "key_id": key_id, "kind": kind})
    fd = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=keys_fd)
    try:
        os.write(fd, line + b"\n")
    finally:
        os.close(fd)


def serve(sock: socket.socket, home: Path, keys_fd: int | None = None) -> None:
    """Answer requests on ``sock`` until the other end closes.

    The key is loaded (or made, in a new home) at the first request, so a command that
    never signs nor asks for the key leaves the home as it found it; and loaded again after
    ``choir keys rotate`` replaced it (``_Held``), always inside the key folder ``keys_fd``
    (``spawn`` pinned it; made and pinned at the first request when missing).
    """
    held = _Held(home, keys_fd)
    store = functools.cache(ArtifactStore)  # made on the first attestation, not before
    while True:
        try:
            raw = recv(sock)
        except (OSError, ValueError, RecursionError):
            return
        if raw is None:
            return
        held.current()
        try:
            if held.signer is not None and _asks_channel(raw):
                sock = _channel(sock)
            else:
                send(sock, answer(raw, held, store))
        except OSError:
            return


def _asks_channel(raw: dict[str, object]) -> bool:
    try:
        return Request.model_validate(raw).op == "channel"
    except ValidationError:
        return False


def _channel(sock: socket.socket) -> socket.socket:
    """Fork a broker of its own for a fork of the client, and hand the client its channel.

    ``choir serve`` forks one worker per request from a process whose key folder is masked, so
    a worker cannot start a broker the way a command does; it gets a copy of this one (the key
    already in memory, the same checks and journal), on a socket pair nobody else holds. The
    copy answers until its worker closes the channel, whether or not the service still runs,
    so a request outlives a kill of the service. Returns the channel this process serves next.
    """
    build_deferred()  # once, here: every copy inherits the validators its checks use
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the copy; tests observe it through its channel)
        sock.close()
        theirs.close()
        return ours
    ours.close()
    try:
        send(sock, Reply(ok=True, kind="channel", pid=pid), fds=(theirs.fileno(),))
    finally:
        theirs.close()
    return sock


def _become_broker(*keep: int) -> None:
    gc.disable()
    gc.freeze()
    non_dumpable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent; EOF stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the copies ``_channel`` forks reap themselves
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    os.chdir("/")


@contextlib.contextmanager
def _quiet_for_fork() -> Iterator[None]:
    """While no other thread holds a lock the broker takes: the broker has only the forking
    thread, and a lock held by another at the fork stays held in it forever, hanging the
    request that first takes it. pydantic builds a model whose validator was deferred under
    one global lock (seen: a broker forked while a verifier's history thread built a model
    hung on its first attestation check); the modules the broker imports late are imported
    before the fork, as an import under way in another thread holds that module's lock."""
    import choir.models.intoto  # noqa: F401 - imported late by the broker's checks
    import choir.trusted.keylists  # noqa: F401

    lock = getattr(pydantic.main, "_rebuild_lock", None)
    with lock if lock is not None else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
        yield  # the broker keeps the lock, its own thread's (reentrant): free for its builds


def spawn(home: Path) -> tuple[int, socket.socket]:
    """Fork the broker for ``home``; returns its pid and the parent's end of the channel.

    The key folder is pinned here, in the caller, before the fork: the caller has read no
    hostile byte yet, and the broker finds its key in that folder only (``_Held``).
    """
    keys_fd = _pin(home)
    try:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with _quiet_for_fork():
            pid = os.fork()
        if pid == 0:  # pragma: no cover (the child; tests observe it through the socket)
            code = 0
            try:
                _become_broker(child.fileno(), *(() if keys_fd is None else (keys_fd,)))
                serve(child, home, keys_fd)
            except BaseException:
                code = 1
            os._exit(code)
    finally:  # the child never gets here (``os._exit``)
        if keys_fd is not None:
            os.close(keys_fd)
    child.close()
    return pid, parent
