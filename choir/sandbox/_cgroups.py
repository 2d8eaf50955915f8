"""cgroup v1 limits for sandboxes that have none of their own (bwrap).

bwrap enforces no resource limits. Where cgroup v1 controllers are writable (root, as in CI),
each run is placed in a ``pids`` and a ``memory`` group; the child joins them before it execs,
so a fork bomb or a memory hog is bounded from its first instruction. Groups are pooled per
process (creating and removing two cgroups costs about 7 ms a run): a group is reused only once
it is empty, its limits are rewritten for each run, and OOM kills are counted against the
group's counter as it stood before the run. Where cgroups are not writable, nothing is applied
and ``applied`` is false.
"""

from __future__ import annotations

import atexit
import os
import secrets
import signal
import threading
import time
from pathlib import Path

from choir.models import Limits

_ROOT = Path("/sys/fs/cgroup")
_POOL: list[tuple[Path, Path]] = []
_ALL: list[tuple[Path, Path]] = []
_LOCK = threading.Lock()


def _oom_kills(mem: Path) -> int:
    for line in (mem / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def _new_pair() -> tuple[Path, Path]:
    name = f"choir-{os.getpid()}-{secrets.token_hex(4)}"
    pids, mem = _ROOT / "pids" / name, _ROOT / "memory" / name
    pids.mkdir()
    try:
        mem.mkdir()
    except OSError:
        pids.rmdir()
        raise
    _ALL.append((pids, mem))
    return pids, mem


def _remove_all() -> None:
    for pair in _ALL:
        for path in pair:
            for _ in range(20):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    _kill(path)
                    time.sleep(0.05)


atexit.register(_remove_all)


def _kill(path: Path) -> None:
    try:
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    except OSError:
        pass


class CgroupLimits:
    """A pids+memory cgroup pair (v1) for one run. Use ``join`` as the child's preexec hook."""

    def __init__(self, limits: Limits) -> None:
        self.applied = False
        self.pair: tuple[Path, Path] | None = None
        try:
            with _LOCK:
                self.pair = _POOL.pop() if _POOL else _new_pair()
            pids, mem = self.pair
            (pids / "pids.max").write_text(str(limits.pids))
            limit = str(limits.memory_mb * 1024 * 1024)
            memsw = mem / "memory.memsw.limit_in_bytes"
            current = int((mem / "memory.limit_in_bytes").read_text())
            # v1 wants memory <= memsw at every step: order the writes accordingly
            files = [mem / "memory.limit_in_bytes", memsw] if int(limit) <= current else \
                [memsw, mem / "memory.limit_in_bytes"]
            for path in files:
                if path.exists():
                    path.write_text(limit)  # memsw: no escaping into swap
            self._oom_before = _oom_kills(mem)
            self.applied = True
        except OSError:
            self.pair = None

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into the groups, then execs.

        Joining before exec bounds the command from its first instruction; doing it in a
        shell rather than a Python ``preexec_fn`` keeps subprocess on its fast spawn path.
        """
        assert self.pair is not None
        pids, mem = (str(p / "cgroup.procs") for p in self.pair)
        script = 'echo $$ > "$1" && echo $$ > "$2" || exit 125; shift 2; exec "$@"'
        return ["/bin/sh", "-c", script, "choir-cgroup", pids, mem, *argv]

    def oom_killed(self) -> bool:
        return self.pair is not None and _oom_kills(self.pair[1]) > self._oom_before

    def close(self) -> None:
        """Empty the groups and return them to the pool."""
        if self.pair is None:
            return
        for _ in range(100):
            if not any((p / "cgroup.procs").read_text().strip() for p in self.pair):
                break
            for path in self.pair:
                _kill(path)
            time.sleep(0.01)
        else:
            return  # still not empty: never reuse it (removed at exit)
        with _LOCK:
            _POOL.append(self.pair)
        self.pair = None
