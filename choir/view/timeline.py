"""A run's timeline from its trace records: rounds, moods, plans and green threads.

The records say what happened and in which order (``choir.trace.record``); each green
thread's sandbox, isolation, limits and step durations come from its stored manifest,
named by hash in its result, and its attestation from the record that links the two. A
``choir verify`` has no records: its session manifest lists the same things.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from choir.exceptions import IntegrityError, UserError
from choir.models import RunManifest
from choir.trace.model import TraceEvent
from choir.trace.record import read_trace, record_path
from choir.verification.session import read_sealed_session
from choir.view.reads import Stores, load_manifest


@dataclass
class Thread:
    """One green thread (a verifier run) or one executor attempt."""

    call_id: str
    name: str
    data: dict[str, Any]
    result: dict[str, Any] = field(default_factory=dict)
    manifest: RunManifest | None = None
    attestation: str = ""
    started: str = ""
    ended: str = ""


@dataclass
class Round:
    """A plan (why these verifiers, in which mood) and what ran for it."""

    number: int
    mood: str
    reason: str
    verifiers: list[str]
    lenses: list[str]
    dropped: list[str]
    threads: list[Thread] = field(default_factory=list)


@dataclass
class Timeline:
    run_id: str
    work_item: str
    entries: list[tuple[str, Any]]  # ("executor", Thread) | ("round", Round) | ("mood", ...) ...
    status: str
    reason: str
    error: str = ""


def _strs(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def _events(stores: Stores, run_id: str) -> list[TraceEvent]:
    path = record_path(run_id, stores.home)
    if not path.is_file():
        raise UserError(f"no trace recorded for run {run_id!r}")
    return read_trace(path)[0]  # the events; their seals are audit's to check


def run_timeline(stores: Stores, run_id: str) -> Timeline:
    """The timeline of ``choir run`` ``run_id``; a torn record ends it with an error.

    Raises:
        UserError: no trace is recorded for ``run_id``.
    """
    stores.artifacts.run_dir(run_id)  # a malformed id is refused before any path is built
    out = Timeline(run_id, "", [], "running", "")
    try:
        events = _events(stores, run_id)
    except (IntegrityError, ValidationError) as exc:
        out.error = str(exc)[:500]
        return out
    calls: dict[str, Thread] = {}
    mood, current = "", None
    for ev in events:
        data = dict(ev.data)
        ev_mood = str(data.get("mood") or "")
        if ev_mood and mood and ev_mood != mood:
            why = str(data.get("reason") or "")
            out.entries.append(("mood", {"from": mood, "to": ev_mood, "why": why,
                                         "ts": ev.ts.isoformat()}))
        mood = ev_mood or mood
        if ev.kind == "run_started":
            out.work_item = str(data.get("work_item") or "")
            out.entries.append(("event", {"kind": ev.kind, "ts": ev.ts.isoformat(),
                                          "data": data}))
        elif ev.kind == "plan":
            plan = data.get("plan")
            current = Round(plan if isinstance(plan, int) else 0, ev_mood,
                            str(data.get("reason") or ""), _strs(data.get("verifiers")),
                            _strs(data.get("lenses")), _strs(data.get("dropped")))
            out.entries.append(("round", current))
        elif ev.kind == "tool_call" and ev.call_id:
            thread = Thread(ev.call_id, ev.name, data, started=ev.ts.isoformat())
            calls[ev.call_id] = thread
            if ev.name == "executor" or current is None:
                out.entries.append(("executor", thread))
            else:
                current.threads.append(thread)
        elif ev.kind == "tool_result" and ev.call_id in calls:
            thread = calls[ev.call_id]
            thread.result, thread.ended = data, ev.ts.isoformat()
            manifest_hash = data.get("manifest_hash")
            if isinstance(manifest_hash, str):
                thread.manifest = load_manifest(stores, manifest_hash)
        elif ev.kind == "attestation" and str(data.get("call")) in calls:
            calls[str(data["call"])].attestation = ev.name
        elif ev.kind in ("decision", "run_ended", "awaiting_approval",
                         "insufficient_evidence", "run_resumed"):
            out.status = str(data.get("status") or out.status)
            out.reason = str(data.get("reason") or out.reason)
            out.entries.append(("event", {"kind": ev.kind, "ts": ev.ts.isoformat(),
                                          "data": data}))
    return out


def session(stores: Stores, run_id: str) -> tuple[dict[str, Any], str] | None:
    """The session manifest of ``choir verify`` ``run_id`` as stored, with its seal's verdict
    over the very bytes read (``read_sealed_session``), or None."""
    return read_sealed_session(stores.artifacts.run_dir(run_id), stores.trusted_keys()[0])


def has_trace(stores: Stores, run_id: str) -> bool:
    return record_path(run_id, stores.home).is_file()
