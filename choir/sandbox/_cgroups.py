"""cgroup v1 limits for sandboxes that have none of their own (bwrap, local).

bwrap enforces no resource limits. Where cgroup v1 controllers are writable (root, as in CI),
each run gets its own ``pids`` and ``memory`` group; the child joins it before it execs, so a
fork bomb or a memory hog is bounded from its first instruction. The group records whether an
OOM kill happened, and is removed after the run. Where cgroups are not writable, nothing is
applied and the manifest says so (``limits_applied`` false via ``applied``).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from choir.models import Limits

_ROOT = Path("/sys/fs/cgroup")


class CgroupLimits:
    """A per-run pids+memory cgroup pair (v1). Use ``join`` as the child's preexec hook."""

    def __init__(self, limits: Limits) -> None:
        self.name = f"choir-{secrets.token_hex(6)}"
        self.dirs: list[Path] = []
        self.applied = False
        try:
            pids = _ROOT / "pids" / self.name
            mem = _ROOT / "memory" / self.name
            pids.mkdir()
            self.dirs.append(pids)
            (pids / "pids.max").write_text(str(limits.pids))
            mem.mkdir()
            self.dirs.append(mem)
            limit = str(limits.memory_mb * 1024 * 1024)
            (mem / "memory.limit_in_bytes").write_text(limit)
            memsw = mem / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(limit)  # no escaping into swap
            self.applied = True
        except OSError:
            self.close()

    def join(self) -> None:
        """Runs in the child between fork and exec."""
        for path in self.dirs:
            with open(path / "cgroup.procs", "w") as fh:
                fh.write(str(os.getpid()))

    def oom_killed(self) -> bool:
        for path in self.dirs:
            control = path / "memory.oom_control"
            if control.exists():
                for line in control.read_text().splitlines():
                    if line.startswith("oom_kill ") and int(line.split()[1]) > 0:
                        return True
                if int((path / "memory.failcnt").read_text() or 0) > 0:
                    return True
        return False

    def kill_all(self) -> None:
        import signal

        for path in self.dirs:
            procs = path / "cgroup.procs"
            try:
                for pid in procs.read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            except OSError:
                pass

    def close(self) -> None:
        import time

        for path in self.dirs:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except OSError:
                    self.kill_all()
                    time.sleep(0.05)
        self.dirs = []
