"""Auditing run traces: every recorded run's trace is exported and verified (seed 004).

A run still being driven holds its lock; its trace is unfinished by design, so it is counted
and skipped, not reported. Anything else that does not verify is a violation named after the
check that failed (``trace_citation_hash``, ``trace_required_steps``, ...).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from choir.exceptions import ChoirError
from choir.models import Violation

if TYPE_CHECKING:
    from choir.artifacts import ArtifactStore


def _live(home: Path, run_id: str) -> bool:
    """True while another process drives ``run_id`` (it holds the run's lock)."""
    lock = home / "locks" / f"{run_id}.lock"
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def recorded_runs(home: Path) -> Iterator[str]:
    from choir.trace.record import traces_dir

    folder = traces_dir(home)
    if folder.is_dir():
        for path in sorted(folder.glob("*.jsonl")):
            yield path.name.removesuffix(".jsonl")


def checkpointed_runs(home: Path) -> set[str]:
    """Every ``choir run`` the checkpoint database knows (read-only; none without one)."""
    path = home / "checkpoints.sqlite"
    if not path.is_file():
        return set()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {str(r[0]) for r in conn.execute("SELECT DISTINCT thread_id FROM checkpoints")}
    except sqlite3.Error:
        return set()  # no table yet: no run ever checkpointed
    finally:
        conn.close()


def check_traces(home: Path, store: ArtifactStore, counts: dict[str, int]) -> list[Violation]:
    """Violations of every recorded run's trace; ``counts`` gains traces (and traces_live).

    A run the checkpoints know but whose trace is gone is named too: deleting a trace must
    not be a way to hide it.
    """
    from choir.trace import export_run, verify_trace

    found: list[Violation] = [
        Violation(kind="trace_missing", object=f"trace {run_id}",
                  expected="the run's recorded trace", found="absent")
        for run_id in sorted(checkpointed_runs(home) - set(recorded_runs(home)))]
    for run_id in recorded_runs(home):
        if _live(home, run_id):
            counts["traces_live"] = counts.get("traces_live", 0) + 1
            continue
        counts["traces"] = counts.get("traces", 0) + 1
        try:
            trace = export_run(run_id, home=home, store=store)
        except (ChoirError, ValidationError, ValueError, OSError) as exc:
            found.append(Violation(kind="trace_unreadable", object=f"trace {run_id}",
                                   expected="an exportable trace", found=str(exc)[:200]))
            continue
        result = verify_trace(trace.model_dump(mode="json"), store)
        for f in result.failures:
            found.append(Violation(kind=f"trace_{f.check}", object=f"trace {run_id}: {f.where}"
                                   [:200], expected=f"the {f.check} check passes",
                                   found=f.detail[:200]))
        if not result.ok and not result.failures:  # fail closed even without a named failure
            found.append(Violation(kind="trace_unverified", object=f"trace {run_id}",
                                   expected="every check passes", found="not verified"))
    return found
