"""Stopping a verification's sandboxes when it runs past its bound or its call is cancelled.

A sandbox step runs in a thread that streams its output (``choir.sandbox.base``), so
cancelling the verification's task would stop waiting for it, not the step: it would run to
its own ``timeout_s`` and seal a run nothing attests. Every step is started as the leader of a
new session (``start_new_session``), the bwrap launchers too (``choir.sandbox._cgroups``),
while the signing broker is forked into this process's session. So the children of this
process that lead their own session are exactly the sandboxes; their groups are killed (a
killed idle launcher is replaced on the next run), and each step ends as killed, its run
sealed and attested like any other (``choir.mcp.tools``, ``choir.serve.worker``). A Docker
container is not a child: the Docker backend registers how to kill each one while it runs
(``container``), and both stops kill those too (the engine's kill, as its timeout does).

``stop_runs`` is the narrow form, for a process that runs other verifications beside the
one it stops (an ``llm`` executor's gate inside a plan): every step is registered, while it
streams, under the run id its thread is running (``running``), and only the groups of the
runs named are killed.

The same registration tells a caller when a run's first step is under way (``begun``):
work that may run beside the step, but would slow its launch by holding the interpreter
lock (the launch is many short system calls, each waiting for the lock again), waits for
it."""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_RUN = threading.local()  # the run id this thread's steps belong to
# a running step -> its run id and how to kill it: a streaming step's session leader (its
# pid), or a container (a token of its own; no child of this process)
_LIVE: dict[object, tuple[str, Callable[[], bool]]] = {}
_STOPPED: set[str] = set()  # rounds stopped: a step of theirs that starts later is killed
_BEGUN: dict[str, threading.Event] = {}  # run id -> set once a step of it started (``begun``)
_LOCK = threading.Lock()


def _of(run: str, round_id: str) -> bool:
    """Whether run ``run`` is one of round ``round_id``'s (its id, a ``-``, the verifier and
    replica: ``choir._core.ids.thread_run_id``)."""
    return bool(round_id) and (run == round_id or run.startswith(round_id + "-"))


@contextmanager
def running(run_id: str) -> Iterator[None]:
    """Steps started by this thread inside the block belong to run ``run_id``."""
    before = getattr(_RUN, "run_id", "")
    _RUN.run_id = run_id
    try:
        yield
    finally:
        _RUN.run_id = before


def _register(key: object, kill: Callable[[], bool]) -> None:
    """A step of this thread's run started: killed at once when its round was stopped
    already (it was still being prepared when ``stop_runs`` looked)."""
    with _LOCK:
        run = getattr(_RUN, "run_id", "")
        _LIVE[key] = (run, kill)
        doomed = any(_of(run, round_id) for round_id in _STOPPED)
        begun = _BEGUN.get(run)
    if begun is not None:
        begun.set()
    if doomed:
        kill()


def _unregister(key: object) -> None:
    with _LOCK:
        _LIVE.pop(key, None)


def started(pid: int) -> None:
    """A step's session leader began streaming (``choir.sandbox.base.stream_process``)."""
    _register(pid, functools.partial(_kill, pid))


def _kill(pid: int) -> bool:
    try:
        os.killpg(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def ended(pid: int) -> None:
    _unregister(pid)


@contextmanager
def container(kill: Callable[[], object]) -> Iterator[None]:
    """A container of this thread's run is running inside the block: ``kill`` stops it
    (``stop_runs`` of its round, ``stop_steps``; at once when its round was stopped
    already)."""
    token = object()

    def killed() -> bool:
        kill()
        return True

    _register(token, killed)
    try:
        yield
    finally:
        _unregister(token)


@contextmanager
def begun(run_id: str) -> Iterator[threading.Event]:
    """An event set once a step of run ``run_id`` has started (its sandbox's process, or its
    container, is running), inside the block; the caller sets it too when the run ends
    without one (replayed, refused, run elsewhere)."""
    event = threading.Event()
    with _LOCK:
        _BEGUN[run_id] = event
    try:
        yield event
    finally:
        with _LOCK:
            if _BEGUN.get(run_id) is event:
                del _BEGUN[run_id]


def _kill_all(which: Callable[[object, str], bool]) -> int:
    with _LOCK:
        kills = [kill for key, (run, kill) in _LIVE.items() if which(key, run)]
    return sum(kill() for kill in kills)


def stop_runs(round_id: str) -> int:
    """Kill every step of round ``round_id``'s runs (a step's group, a container), and every
    one that starts from now on until ``forget``; returns how many were running."""
    with _LOCK:
        _STOPPED.add(round_id)
    return _kill_all(lambda key, run: _of(run, round_id))


def forget(round_id: str) -> None:
    """Round ``round_id`` is over: its id stops nothing more."""
    with _LOCK:
        _STOPPED.discard(round_id)


def _children() -> list[int]:
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            found.append(int(entry.name))
    return found


def stop_steps() -> int:
    """Kill the process group of every child leading its own session, and every container
    a step of this process runs; returns how many."""
    killed = _kill_all(lambda key, run: not isinstance(key, int))  # the containers
    for pid in _children():
        try:
            if os.getsid(pid) != pid:
                continue  # the broker, a git call: this process's own session
            os.killpg(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            continue
    return killed


__all__ = ["begun", "container", "ended", "forget", "running", "started", "stop_runs",
           "stop_steps"]
