"""Stopping a verification's sandboxes when it runs past its bound or its call is cancelled.

A sandbox step runs in a thread that streams its output (``choir.sandbox.base``), so
cancelling the verification's task would stop waiting for it, not the step: it would run to
its own ``timeout_s`` and seal a run nothing attests. Every step is started as the leader of a
new session (``start_new_session``), the bwrap launchers too (``choir.sandbox._cgroups``),
while the signing broker is forked into this process's session. So the children of this
process that lead their own session are exactly the sandboxes; their groups are killed (a
killed idle launcher is replaced on the next run), and each step ends as killed, its run
sealed and attested like any other (``choir.mcp.tools``, ``choir.serve.worker``). A Docker
container is not a child: it stops at its own timeout."""

from __future__ import annotations

import os
import signal
from pathlib import Path


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
    """Kill the process group of every child leading its own session; returns how many."""
    killed = 0
    for pid in _children():
        try:
            if os.getsid(pid) != pid:
                continue  # the broker, a git call: this process's own session
            os.killpg(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            continue
    return killed


__all__ = ["stop_steps"]
