"""cgroup v1 limits for sandboxes that have none of their own (bwrap).

bwrap enforces no resource limits. Where cgroup v1 controllers are writable (root, as in CI),
each run is placed in a ``pids`` and a ``memory`` group before its first instruction, so a fork
bomb or a memory hog is bounded from the start. Where they are not writable, nothing is
applied and ``applied`` is false.

Why the groups are joined ahead of time: moving a process into a cgroup takes the kernel's
global ``cgroup_threadgroup_rwsem`` for writing, which waits for an RCU grace period whenever
no other move happened in the last grace period. Measured here (cgroup v1, 6.x kernel) the
``write`` to ``cgroup.procs`` blocks 5-17 ms, off-CPU; back-to-back moves are nearly free,
which is why ``true`` in a loop hid it and a 40 ms Python start-up showed it in full. So each
pooled group pair keeps one idle *launcher*: a ``/bin/sh -s`` that has already moved itself
into both groups and waits on its stdin. A run hands it ``exec bwrap ...`` and the sandbox
starts inside the groups with no move on its path; a fresh launcher is armed in the background
once the pair is empty again. Groups are pooled per process (making and removing two cgroups
costs about 7 ms), limits are rewritten for each run, and OOM kills are counted against the
group's counter as it stood before the run. Groups of a Choir process that is gone (killed
before its ``atexit``) are removed by the next process that pools groups.
"""

from __future__ import annotations

import atexit
import collections
import functools
import hashlib
import os
import queue
import resource
import secrets
import select
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from choir._core import mounts
from choir.models import Limits

_ROOT = Path("/sys/fs/cgroup")
_CONTROLLERS = ("pids", "memory")
_READY = b"J"
_JOIN_TIMEOUT_S = 10.0
_ARM_WAIT_S = 0.25  # how long a run waits for a pair being re-armed before making its own
STAGE = "/run/choir-stage"  # an empty mount point; filled only inside private mount namespaces
STAGE_SLOTS = 16  # mount points made with the tmpfs, off the run's path (one exec fewer each)
STAGE_PYTHON = f"{STAGE}/python"  # where the launcher binds the base interpreter when armed


def reachable(path: str) -> bool:
    """True when an unprivileged user can reach ``path`` (every ancestor has o+x)."""
    parent = os.path.dirname(path)
    while parent and parent != "/":
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        parent = os.path.dirname(parent)
    return True


@functools.cache
def prestaged_python() -> str | None:
    """The base installation Choir's Python came from, when a step run as ``nobody`` cannot
    reach it (pyenv under a 0700 /root): the launcher binds it at STAGE_PYTHON as it is
    armed, so a run that uses it (nearly every run) pays no ``mount`` on its path.

    Only the mount point moves off the path: a step still sees it only when its toolchain
    chose it (``_toolchain.choose`` checks it like any bind), and only read-only.
    """
    if os.geteuid() != 0:
        return None
    real = os.path.realpath(sys.base_prefix)
    if real == "/usr" or real.startswith(("/usr/", "/etc/")) or reachable(real):
        return None
    return real if os.path.isdir(real) else None


def stage_mount() -> str:
    """Shell text that fills STAGE in a fresh private mount namespace: a small tmpfs, the
    spare mount points, and the base interpreter (``prestaged_python``) bound read-only."""
    text = (f"mount -t tmpfs -o mode=0755,size=64k choir-stage {STAGE} && mkdir "
            + " ".join(f"{STAGE}/{n}" for n in range(STAGE_SLOTS)))
    python = prestaged_python()
    if python is not None:
        text += (f" && mkdir {STAGE_PYTHON} && mount --bind {shlex.quote(python)} "
                 f"{STAGE_PYTHON}")
    return text


@dataclass
class _Slot:
    """One pids+memory group pair and, while idle, the launcher waiting inside it."""

    pids: Path
    mem: Path
    launcher: subprocess.Popen[bytes] | None = None
    mounts: bytes = b""  # the mount table its launcher's namespace was copied from
    standing: tuple[object, ...] = ()  # the umask and limits its launcher was started with


def _oom_kills(mem: Path) -> int:
    for line in (mem / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def _members(path: Path) -> list[int]:
    try:
        return [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _kill(path: Path) -> None:
    for pid in _members(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _mount_table() -> bytes:
    """A digest of this process's mount table, and of how many mounts it made or removed
    (``choir._core.mounts.generation``: the same table read twice may hold different
    mounts): what a launcher armed now would copy."""
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            table = fh.read()
    except OSError:
        return b""
    seen = hashlib.blake2b(table, digest_size=16)
    seen.update(mounts.generation().to_bytes(8, "little"))
    return seen.digest()


def _standing() -> tuple[object, ...]:
    """What a launcher started now passes to its run besides its mounts: this process's
    umask (read from ``/proc``: setting it to read it would race the arming thread) and
    resource limits. A worker of ``choir serve`` arms launchers with the service's, then
    takes its client's (``choir.serve.worker._stand``)."""
    umask = -1
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    umask = int(line.split()[1], 8)
                    break
    except (OSError, ValueError, IndexError):
        pass
    limits = tuple(resource.getrlimit(getattr(resource, name)) for name in dir(resource)
                   if name.startswith("RLIMIT_"))
    return umask, limits


def _launch(slot: _Slot) -> subprocess.Popen[bytes]:
    """A shell that moves itself into the slot's groups, says so, then waits for its command."""
    shell, stage = ["/bin/sh", "-s"], ""
    slot.standing = _standing()
    if os.geteuid() == 0:
        slot.mounts = _mount_table()  # before the copy: a later mount makes it stale
        # a private mount namespace with a tmpfs on STAGE, where the run binds what the
        # unprivileged bwrap must see but cannot reach (bwrap.BwrapSandbox.command)
        os.makedirs(STAGE, mode=0o755, exist_ok=True)
        shell = ["unshare", "--mount", "--propagation", "private", *shell]
        stage = f" && {stage_mount()}"
    proc = subprocess.Popen(
        shell, env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    assert proc.stdin is not None
    pids, mem = (shlex.quote(str(p / "cgroup.procs")) for p in (slot.pids, slot.mem))
    proc.stdin.write(
        f"echo $$ > {pids} && echo $$ > {mem}{stage} && printf J || exit 125\n".encode())
    proc.stdin.flush()
    return proc


def _await_ready(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """True once the launcher reported that it sits in both groups."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout.fileno()], [], [], timeout_s)
    return bool(ready) and os.read(proc.stdout.fileno(), 1) == _READY


def _discard(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def _sweep_dead_owners() -> None:
    """Remove empty ``choir-PID-*`` groups whose PID is gone (a killed Choir process)."""
    for controller in _CONTROLLERS:
        try:
            entries = list((_ROOT / controller).glob("choir-*-*"))
        except OSError:
            continue
        for path in entries:
            try:
                pid = int(path.name.split("-")[1])
                os.kill(pid, 0)
                continue  # the owner lives: never touch its groups
            except ProcessLookupError:
                pass
            except (ValueError, PermissionError):
                continue
            try:
                path.rmdir()  # fails while anything is still inside: then it stays
            except OSError:
                pass


class _Pool:
    """Per-process pool of group pairs, each idle pair holding a ready launcher."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.armed = threading.Condition(self.lock)
        self.arming = 0  # pairs queued to be (re-)armed: they will be ready soon
        self.ready: collections.deque[_Slot] = collections.deque()
        self.slots: list[_Slot] = []
        self.closed = False
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.worker: threading.Thread | None = None
        self.rearm = True  # pairs given back are armed again (single_use turns it off)
        _sweep_dead_owners()

    def take(self) -> _Slot:
        """The pair that has waited longest (its launcher has joined by now), or a new one.

        Raises:
            OSError: the groups cannot be made (no writable cgroup v1 controllers).
        """
        with self.lock:
            # A pair being re-armed is ready within a cgroup move; waiting for it beats making
            # a new pair (which pays the same move, on this path). Without the wait, a run
            # that came back faster than the background thread re-armed its pair made a new
            # one each time, and the pool grew with load, not with concurrency (a flaky test).
            deadline = time.monotonic() + _ARM_WAIT_S
            while not self.ready and self.arming and time.monotonic() < deadline:
                self.armed.wait(timeout=max(0.0, deadline - time.monotonic()))
            slot = self.ready.popleft() if self.ready else None
            low = not self.ready and not self.arming
            if low:
                self.arming += 1  # the spare queued below
        if slot is not None and ((slot.mounts and slot.mounts != _mount_table())
                                 or slot.standing != _standing()):
            # armed before a mount this process made since (an overlay worktree,
            # choir.evidence.worktrees): its private copy of the mounts lacks it, and a run
            # started from it would not see the worktree. A fresh launcher copies them now.
            # So with another umask or limits (a warm worker took its client's).
            _discard(slot.launcher)
            slot.launcher = _launch(slot)
        if slot is None:
            slot = self._new_slot()
            slot.launcher = _launch(slot)
        if low:  # keep a spare armed, so back-to-back runs never wait for a move
            self._background(self._add_spare)
        return slot

    def give_back(self, slot: _Slot) -> None:
        """Return an empty pair; it is re-armed off the caller's path (unless
        ``single_use``: then it stays empty, its groups removed at exit)."""
        with self.lock:
            if not self.rearm:
                return
            self.arming += 1
        self._background(lambda: self._arm(slot))

    def _new_slot(self) -> _Slot:
        name = f"choir-{os.getpid()}-{secrets.token_hex(4)}"
        slot = _Slot(_ROOT / "pids" / name, _ROOT / "memory" / name)
        with self.lock:
            if self.closed:
                raise OSError("cgroup pool closed")
            self.slots.append(slot)
        slot.pids.mkdir()
        try:
            slot.mem.mkdir()
        except OSError:
            slot.pids.rmdir()
            with self.lock:
                self.slots.remove(slot)
            raise
        return slot

    def prearm(self, count: int) -> None:
        """Arm up to ``count`` pairs now, on the caller's thread, so this process's first
        runs start in ready pairs (an idle worker of ``choir serve``, before its request).

        Raises:
            OSError: the groups cannot be made.
        """
        with self.lock:  # a spare already being armed (``take``'s) counts
            wanted = count - len(self.ready) - self.arming
        for _ in range(max(0, wanted)):
            with self.lock:
                self.arming += 1
            self._add_spare()

    def _add_spare(self) -> None:
        try:
            slot = self._new_slot()
        except BaseException:
            self._armed_one()
            raise
        self._arm(slot)

    def _armed_one(self) -> None:
        with self.lock:
            self.arming -= 1
            self.armed.notify_all()

    def _arm(self, slot: _Slot) -> None:
        try:
            launcher = _launch(slot)
        except BaseException:
            self._armed_one()
            raise
        with self.lock:
            self.arming -= 1
            self.armed.notify_all()
            if not self.closed:
                slot.launcher = launcher
                self.ready.append(slot)
                return
        _discard(launcher)

    def _background(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)
        with self.lock:
            if self.worker is None:
                self.worker = threading.Thread(target=self._work, name="choir-cgroups",
                                               daemon=True)
                self.worker.start()

    def _work(self) -> None:
        """Arm launchers, for the life of the process.

        This thread must never end while a launcher it spawned may still run: bwrap's
        ``--die-with-parent`` is ``PR_SET_PDEATHSIG``, which fires when the parent *thread*
        exits (measured: a worker that retired when idle killed a run 4.5 s in).
        """
        while True:
            try:
                self.jobs.get()()
            except Exception:  # noqa: BLE001 - a refill that failed: take() makes its own
                pass

    def close(self) -> None:
        """Stop the launchers and remove every group (at exit)."""
        with self.lock:
            self.closed = True
            slots = list(self.slots)
            self.ready.clear()
        for slot in slots:
            _discard(slot.launcher)
            slot.launcher = None
            for path in (slot.pids, slot.mem):
                for _ in range(20):
                    try:
                        path.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        _kill(path)
                        time.sleep(0.05)


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> _Pool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.owner != os.getpid():  # a forked child starts its own
            _POOL = _Pool()
        return _POOL


def prearm(count: int, *, single_use: bool = False) -> bool:
    """Arm ``count`` launchers in this process's pool now (``_Pool.prearm``); False where
    cgroups cannot be used (the runs then go without them, as they would anyway).

    ``single_use``: the pairs runs give back are not armed again (they stay empty until
    exit). For a process that answers one request and exits (a worker of ``choir serve``):
    re-arming a pair (two mounts, folders and a bwrap probe, about ten processes) would only
    compete for the CPU with the request's own sealing and attestation after its steps. A
    run that finds no armed pair arms one on its own path, as a cold process does, and a
    pool run down to none still arms one spare in the background (``take``)."""
    pool = _pool()
    pool.rearm = not single_use
    try:
        pool.prearm(count)
    except OSError:
        return False
    return True


@atexit.register
def _close_pool() -> None:
    if _POOL is not None and _POOL.owner == os.getpid():
        _POOL.close()


class CgroupLimits:
    """A pids+memory cgroup pair (v1) for one run; ``spawn`` starts the run inside it."""

    def __init__(self, limits: Limits) -> None:
        self.applied = False
        self.slot: _Slot | None = None
        self._oom_before = 0
        self._broken = False
        try:
            self.slot = _pool().take()
            (self.slot.pids / "pids.max").write_text(str(limits.pids))
            limit = limits.memory_mb * 1024 * 1024
            mem = self.slot.mem
            memsw = mem / "memory.memsw.limit_in_bytes"
            current = int((mem / "memory.limit_in_bytes").read_text())
            # v1 wants memory <= memsw at every step: order the writes accordingly
            files = [mem / "memory.limit_in_bytes", memsw] if limit <= current else \
                [memsw, mem / "memory.limit_in_bytes"]
            for path in files:
                if path.exists():
                    path.write_text(str(limit))  # memsw: no escaping into swap
            self._oom_before = _oom_kills(mem)
            self.applied = True
        except OSError:
            if self.slot is not None:
                _discard(self.slot.launcher)
                self.slot.launcher = None
                self.slot = None  # never reused: its limits are unknown (removed at exit)

    def spawn(self, argv: list[str], setup: str = "") -> subprocess.Popen[bytes]:
        """Start ``argv`` inside the groups, as the leader of a new session.

        The idle launcher already sits in both groups; it ``exec``s ``argv`` with stdin from
        /dev/null, so nothing of the command ever runs outside the limits. ``setup`` is
        shell text run first, in the launcher's private mount namespace (``&&``-terminated).

        Raises:
            OSError: the process could not be placed in the groups.
        """
        assert self.slot is not None
        launcher, self.slot.launcher = self.slot.launcher, None
        if (launcher is None or not _await_ready(launcher, _JOIN_TIMEOUT_S)
                or launcher.poll() is not None):
            _discard(launcher)  # died or stuck: one fresh try, then give up
            launcher = _launch(self.slot)
            if not _await_ready(launcher, _JOIN_TIMEOUT_S):
                _discard(launcher)
                self._broken = True
                raise OSError("could not move the sandbox into its cgroups")
        assert launcher.stdin is not None
        try:
            launcher.stdin.write(os.fsencode(f"{setup}exec {shlex.join(argv)} </dev/null\n"))
            launcher.stdin.close()
        except OSError:
            _discard(launcher)
            raise
        return launcher

    def oom_killed(self) -> bool:
        return self.slot is not None and _oom_kills(self.slot.mem) > self._oom_before

    def close(self) -> None:
        """Empty the groups and return them to the pool."""
        slot, self.slot = self.slot, None
        if slot is None:
            return
        _discard(slot.launcher)  # only set when spawn was never called
        slot.launcher = None
        for _ in range(100):
            if not any(_members(p) for p in (slot.pids, slot.mem)):
                break
            for path in (slot.pids, slot.mem):
                _kill(path)
            time.sleep(0.01)
        else:
            return  # still not empty: never reuse it (removed at exit)
        if not self._broken and slot.pids.is_dir() and slot.mem.is_dir():
            _pool().give_back(slot)  # a pair that failed a join is dropped (removed at exit)
