"""The service: one listener, a bounded set of pre-forked workers, nothing else.

``choir serve`` runs separated from the key like every command that reads hostile bytes
(its broker holds the key; ``$CHOIR_HOME/keys`` is masked here and in every worker). This
process never reads a request itself: it accepts a connection, checks that the peer is this
user (``SO_PEERCRED``; the socket is 0600 in a 0700 folder anyway, ``choir.serve.place``), and
hands the connection to an idle worker (``choir.serve.worker``), which answers it and exits.
At most ``jobs`` workers exist, busy or idle, so at most ``jobs`` requests run side by side;
when one exits, a fresh idle one is forked, off any request's path (with ``jobs`` of 2, one
client after another always finds a warm one). A connection that finds none idle waits in a
bounded queue and is told so.

The process stays single-threaded (a selector loop; signals arrive through a wakeup pipe),
so each fork copies no lock held by another thread. A worker owns its connection and its
own broker, so a kill of the service (even ``kill -9``) cuts no request: the worker finishes
and answers. Idle workers exit when their end of the service's channel closes. A second
service for the same home is refused while one holds the lock; a dead one's socket file is
replaced.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from choir._core import frames
from choir._core.paths import artifact_dir
from choir._version import __version__
from choir.exceptions import UserError
from choir.serve import place, stale
from choir.serve.worker import MODELS, Command, Service
from choir.trusted.confine import origin_namespace

QUEUE_MAX = 64
FAILURES_MAX = 5  # workers that die idle in a row before the service gives up
TICK_S = 1.0
MODELS_WAIT_S = 60.0  # the longest the service holds its forks for litellm's import
_CREDS = struct.Struct("3i")  # pid, uid, gid


@dataclass
class _Worker:
    pid: int
    ctl: socket.socket | None  # None once it has its connection


def take_lock(fd: int) -> int:
    """Hold the service's lock for this process's life; returns its descriptor.

    Raises:
        UserError: another service holds it.
    """
    lock = os.open(place.LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                   dir_fd=fd)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(lock, 32, 0).decode(errors="replace").strip()
        os.close(lock)
        raise UserError(f"a service already runs for this CHOIR_HOME (pid {pid or '?'})\n"
                        "  fix: `choir serve --stop` first, or use it as it is") from None
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)
    return lock


def running_pid(home: Path) -> int | None:
    """The pid of the service holding ``home``'s lock, or None when none runs.

    Raises:
        UserError: the folder is not safe to look into.
    """
    fd = place.open_folder(home, create=False)
    if fd is None:
        return None
    try:
        try:
            lock = os.open(place.LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(lock, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else None
        finally:
            os.close(lock)
        return None
    finally:
        os.close(fd)


def listen(fd: int) -> socket.socket:
    """Bind the socket in the checked folder (0600 from its first instant), replacing a dead
    service's socket file; anything else at its name is refused.

    Raises:
        UserError: something that is not a socket of this user's sits at its name.
    """
    if place.check_socket(fd):
        os.unlink(place.SOCKET, dir_fd=fd)  # the lock is ours: its service is gone
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(place.socket_address(fd))
    finally:
        os.umask(old)
    sock.listen(QUEUE_MAX)
    sock.setblocking(False)
    return sock


def peer_uid(conn: socket.socket) -> int:
    _, uid, _ = _CREDS.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                              _CREDS.size))
    return int(uid)


class Server:
    """The loop: accept, check the peer, dispatch, keep ``jobs`` workers, time out idle."""

    def __init__(self, service: Service, folder_fd: int, lock_fd: int, *, jobs: int,
                 idle_timeout_s: float) -> None:
        self.service, self.folder_fd, self.lock_fd = service, folder_fd, lock_fd
        self.jobs, self.idle_timeout_s = jobs, idle_timeout_s
        self.listener = listen(folder_fd)
        self.idle: deque[_Worker] = deque()
        self.busy: dict[int, _Worker] = {}
        self.queue: deque[socket.socket] = deque()
        self.last_active = time.monotonic()
        self.stopping = False
        self.failures, self.failed_at = 0, 0.0
        self.ready_fd: int | None = None
        self.models = "litellm" in sys.modules  # imported here: every worker has it
        self.warming: threading.Thread | None = None
        self.warming_since = 0.0
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "signal")

    def run(self, ready: int | None = None) -> None:
        """Serve until SIGTERM/SIGINT or the idle timeout; ``ready`` is written to once the
        socket listens and the first workers wait (``choir serve --detach`` waits for it)."""
        previous = {sig: signal.signal(sig, lambda *_: None)
                    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
        old_wakeup = signal.set_wakeup_fd(self._wake_w)
        self.ready_fd = ready
        try:
            self._warm_models()  # a home whose requests used a model: the first workers
            self._fill()  # are forked once it is imported (none is forked without it first)
            if ready is not None:
                os.write(ready, b"ready\n")
                os.close(ready)
                self.ready_fd = None
            while not self.stopping:
                for key, _ in self.selector.select(TICK_S):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "signal":
                        self._signals()
                self._reap()
                self._warm_models()
                self._dispatch()
                self._fill()
                if (self.idle_timeout_s and not self.busy and not self.queue and
                        time.monotonic() - self.last_active > self.idle_timeout_s):
                    self.stopping = True
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.close()

    def close(self) -> None:
        """Stop listening and remove the socket; idle workers exit as their channel closes,
        busy ones finish their request."""
        try:
            os.unlink(place.SOCKET, dir_fd=self.folder_fd)
        except FileNotFoundError:
            pass
        self._drop()

    def _drop(self) -> None:
        """Close this process's copies of the listener, the waiting connections, the idle
        workers' channels and the signal pipe (closing a copy affects no other process)."""
        self.selector.close()
        self.listener.close()
        for conn in self.queue:
            conn.close()
        self._close_idle()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _close_idle(self) -> None:
        """Close this process's channel to every idle worker (each exits as it closes,
        before any request) and forget them."""
        for worker in self.idle:
            if worker.ctl is not None:
                worker.ctl.close()
        self.idle.clear()

    def _signals(self) -> None:
        try:
            got = os.read(self._wake_r, 64)
        except BlockingIOError:
            return
        if {signal.SIGTERM, signal.SIGINT} & set(got):
            self.stopping = True

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(True)
            self.last_active = time.monotonic()
            if peer_uid(conn) != os.geteuid():
                _tell(conn, {"refused": "the service answers only its own user"})
                conn.close()
            elif len(self.queue) >= QUEUE_MAX:
                _tell(conn, {"refused": f"{QUEUE_MAX} requests already wait; run cold"})
                conn.close()
            else:
                self.queue.append(conn)
                if not self.idle:
                    _tell(conn, {"queued": len(self.queue)})

    def _dispatch(self) -> None:
        while self.queue and self.idle:
            conn, worker = self.queue.popleft(), self.idle.popleft()
            assert worker.ctl is not None
            try:
                frames.send(worker.ctl, b"conn", (conn.fileno(),))
                handed = True
            except OSError:
                handed = False  # that worker died idle; it is reaped on the next turn
            worker.ctl.close()
            worker.ctl = None
            if handed:
                self.busy[worker.pid] = worker
                conn.close()  # the worker holds it now
            else:
                self.queue.appendleft(conn)

    def _reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.busy.pop(pid, None) is not None:
                self.last_active = time.monotonic()
                self.failures = 0
            for worker in list(self.idle):
                if worker.pid == pid:  # died before any request: its traceback is above
                    self.idle.remove(worker)
                    if worker.ctl is not None:
                        worker.ctl.close()
                    self.failures += 1
                    self.failed_at = time.monotonic()
                    if self.failures >= FAILURES_MAX:
                        print(f"choir serve: {self.failures} workers in a row ended before "
                              "any request; stopping", file=sys.stderr, flush=True)
                        self.stopping = True

    def _warm_models(self) -> None:
        """Import litellm here once a request needed it (the note its worker left, which
        outlives the service): each such request imported it in its own worker, seconds
        every time (4-5 s on this machine). The import runs in a thread of this process and
        no worker is forked meanwhile (a fork while another thread imports could hand the
        child a held import lock); requests go to the idle workers or wait, told ``queued``.
        Once it is done, the idle workers forked without it are retired and replaced. An
        import that takes over ``MODELS_WAIT_S`` no longer holds the forks: the workers are
        forked without it (a request with a model imports it, as before), never tried again.
        """
        if self.warming is not None:
            if self.warming.is_alive():
                if time.monotonic() - self.warming_since < MODELS_WAIT_S:
                    return
                print(f"choir serve: importing litellm took over {MODELS_WAIT_S:g} s; workers "
                      "are forked without it", file=sys.stderr, flush=True)
                self.warming, self.models = None, True
                return
            self.warming, self.models = None, True
            self._close_idle()  # forked without it: each exits before any request
            return
        if self.models or self.stopping:
            return
        try:
            os.stat(MODELS, dir_fd=self.folder_fd, follow_symlinks=False)
        except OSError:
            return
        self.warming = threading.Thread(target=_import_models, name="choir-serve-models",
                                        daemon=True)
        self.warming_since = time.monotonic()
        self.warming.start()

    def _fill(self) -> None:
        from choir.exceptions import IntegrityError

        if self.warming is not None:
            return  # no fork while another thread imports (``_warm_models``)
        if self.failures and time.monotonic() - self.failed_at < TICK_S:
            return  # a worker just failed to start: not in a tight loop
        while len(self.idle) + len(self.busy) < self.jobs and not self.stopping:
            try:
                self.idle.append(self._fork())
            except IntegrityError as exc:  # the broker is gone: no worker could sign
                print(f"choir serve: stopping: {exc}", file=sys.stderr, flush=True)
                self.stopping = True

    def _fork(self) -> _Worker:
        from choir.serve import worker
        from choir.trusted import close_all, signer

        broker_pid, broker = signer(self.service.home).channel()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        gc.collect()
        gc.freeze()  # the workers share the service's pages instead of copying them
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover (the worker; tests observe it through the socket)
            code = 0
            try:
                self._become_worker(ours)
                close_all()  # the service's channel: its broker serves the service alone
                worker.warm_idle(self.service)
                worker.run(self.service, theirs, (broker_pid, broker))
                worker.finish()
            except BaseException:  # noqa: BLE001 - a worker never unwinds into the service
                traceback.print_exc()  # to the service's output (its log when detached)
                code = 1
            os._exit(code)
        broker.close()
        theirs.close()
        return _Worker(pid, ours)

    def _become_worker(self, ours: socket.socket) -> None:
        """Drop everything of the service's: its listener, queue, lock, other workers'
        channels and signal plumbing (the lock and the socket stay the service's alone)."""
        signal.set_wakeup_fd(-1)
        os.setpgid(0, 0)  # a Ctrl-C at the service's terminal is not a client's Ctrl-C
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        ours.close()
        self._drop()
        os.close(self.folder_fd)
        os.close(self.lock_fd)  # the lock stays the service's: its copy here is gone
        if self.ready_fd is not None:
            os.close(self.ready_fd)


def _import_models() -> None:
    """litellm, imported and configured as a request would (``choir.llm``); not installed,
    or failing: the requests import it themselves, as before."""
    try:
        from choir.llm import litellm_module

        litellm_module()
    except Exception:  # noqa: BLE001 - the service runs on without it
        pass


def start(home: Path, commands: Mapping[str, Command], *, jobs: int, idle_timeout_s: float,
          ready: int | None = None) -> None:
    """Run the service for ``home`` until it is stopped or idle for ``idle_timeout_s``
    (0: never). The caller is already separated (``choir.trusted.separate``).

    Raises:
        UserError: the folder is unsafe, another service runs, or the key cannot be loaded.
    """
    from choir.exceptions import IntegrityError
    from choir.trusted import signer

    home = home.absolute()  # as `separate` started the broker (a link in it stays a link)
    fd = place.open_folder(home, create=True)
    assert fd is not None
    try:
        lock = take_lock(fd)
        try:
            try:
                signer(home)  # the key loads now: a broken one is said before anyone waits
            except IntegrityError as exc:
                raise UserError(str(exc)) from None
            root = os.stat("/")
            service = Service(home=home, version=__version__, code=stale.code(),
                              start_env=stale.start_env(os.environ),
                              root=(root.st_dev, root.st_ino), commands=dict(commands),
                              artifacts=artifact_dir().absolute(),
                              mounts=origin_namespace(), standing=stale.standing())
            Server(service, fd, lock, jobs=jobs, idle_timeout_s=idle_timeout_s).run(ready)
        finally:
            os.close(lock)
    finally:
        os.close(fd)


def _tell(conn: socket.socket, message: dict[str, object]) -> None:
    try:
        conn.settimeout(1.0)
        frames.send(conn, json.dumps(message).encode())
    except OSError:
        pass


__all__ = ["Server", "listen", "peer_uid", "running_pid", "start", "take_lock"]
