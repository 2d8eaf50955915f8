"""Auditing run traces: every recorded run's trace is exported and verified (docs/trace.md).

A run still being driven holds its lock; its trace is unfinished by design, so it is counted
and skipped, not reported. Anything else that does not verify is a violation named after the
check that failed (``trace_citation_hash``, ``trace_seal_integrity``, ...). Every trace is
held against this home (``choir.trace.grounding``): its seals, attestations and AHDB atoms.
A crashed run's trace is unfinished (``trace_required_steps``), and may end in events it had
no time to seal (``trace_seal_coverage``); both name ``choir run --resume``, which clears them.
"""

from __future__ import annotations

import fcntl
import sqlite3
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from choir.exceptions import ChoirError
from choir.models import Attestation, Violation

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore


# how long after its minting a running run may not have recorded an attestation yet (its
# node records it on return, seconds later); ``CHOIR_AUDIT_LIVE_GRACE_S`` sets it
LIVE_GRACE_S = 600.0


def _grace() -> float:
    import os

    try:
        return max(0.0, float(os.environ.get("CHOIR_AUDIT_LIVE_GRACE_S", LIVE_GRACE_S)))
    except ValueError:
        return LIVE_GRACE_S


def _live(home: Path, run_id: str) -> bool:
    """True while another process drives ``run_id`` (it holds the run's lock).

    The lock is opened as a record is (``open_record``): never through a link, never a FIFO
    or a device (one planted there hung the audit in its ``open``).

    Raises:
        IntegrityError: the lock is a link or not a regular file.
    """
    from choir.verification.seal import open_record

    try:
        fh = open_record(home / "locks" / f"{run_id}.lock")
    except FileNotFoundError:
        return False
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
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
        from choir.graph.checkpoints import run_threads

        return set(run_threads([str(r[0]) for r in conn.execute(
            "SELECT DISTINCT thread_id FROM checkpoints")]))
    except sqlite3.Error:
        return set()  # no table yet: no run ever checkpointed
    finally:
        conn.close()


def _attested_calls(attestations: Iterable[Attestation]) -> dict[str, dict[str, str]]:
    """run id -> {attestation id: verifier call} for every attestation minted in a run."""
    from choir.trace.step import parent_run

    out: dict[str, dict[str, str]] = {}
    for att in attestations:
        run = parent_run(att.body.run_id, att.body.verifier)
        if run != att.body.run_id:
            out.setdefault(run, {})[att.id] = att.body.run_id
    return out


def check_traces(home: Path, store: ArtifactStore, counts: dict[str, int],
                 attestations: Iterable[Attestation] = ()) -> list[Violation]:
    """Violations of every recorded run's trace; ``counts`` gains traces (and traces_live).

    ``attestations``: the valid ones. A run the checkpoints know, or that minted one of them,
    but whose trace is gone is named too, and so is a valid attestation minted in a run that
    its trace does not record: deleting a trace, or a verifier call from one, must not be a
    way to hide it.
    """
    from choir.attest import trusted_key_ids
    from choir.trace import RecordSources, export_run, verify_trace

    valid = {att.id: att for att in attestations}
    minted = _attested_calls(valid.values())
    sources = RecordSources(home=home, store=store, trusted=trusted_key_ids(home),
                            verified=valid)
    recorded = set(recorded_runs(home))
    found: list[Violation] = [
        Violation(kind="trace_missing", object=f"trace {run_id}",
                  expected="the run's recorded trace", found="absent")
        for run_id in sorted((checkpointed_runs(home) | set(minted)) - recorded)]
    for run_id in sorted(recorded):
        try:
            live = _live(home, run_id)
            trace = export_run(run_id, home=home, store=store)
            # a run whose record ended is never live, whoever holds its lock: a process
            # left holding it must not hide a rewritten record from the audit
            live = live and (not trace.events or trace.events[-1].kind != "run_ended")
            if live:  # its sealed part is checked as the trace verifier checks it
                trace = export_run(run_id, home=home, store=store, sealed_only=True)
        except (ChoirError, ValidationError, ValueError, OSError) as exc:
            counts["traces"] = counts.get("traces", 0) + 1
            found.append(Violation(kind="trace_unreadable", object=f"trace {run_id}",
                                   expected="an exportable trace", found=str(exc)[:200]))
            continue
        counts["traces_live" if live else "traces"] = \
            counts.get("traces_live" if live else "traces", 0) + 1
        in_trace = {ev.name for ev in trace.events if ev.kind == "attestation"}
        now, grace = datetime.now(UTC), _grace()
        for att_id, call in sorted(minted.get(run_id, {}).items()):
            # a live run records an attestation the moment its node returns: one minted
            # longer ago than that and still unrecorded is a record cut back while a process
            # holds the lock, not a run under way (review 17e)
            recent = live and (now - valid[att_id].body.ended_at).total_seconds() < grace
            if att_id not in in_trace and not recent:
                found.append(Violation(kind="trace_unrecorded_attestation",
                                       object=f"trace {run_id}: {call}",
                                       expected=f"attestation {att_id} in the trace",
                                       found="absent"))
        result = verify_trace(trace.model_dump(mode="json"), store, partial=live,
                              sources=sources)
        for f in result.failures:
            found.append(Violation(kind=f"trace_{f.check}", object=f"trace {run_id}: {f.where}"
                                   [:200], expected=f"the {f.check} check passes",
                                   found=f.detail[:200]))
        if not result.ok and not result.failures:  # fail closed even without a named failure
            found.append(Violation(kind="trace_unverified", object=f"trace {run_id}",
                                   expected="every check passes", found="not verified"))
    return found
