"""The run list: every ``choir run`` and ``choir verify`` under this home, newest first.

A ``choir plan run`` is known by its plan record (``plans/PLAN_ID/state.json``, re-read when
its size or modification time changed; ``choir.view.plans`` reads it). A ``choir run`` is
known by its trace records (``traces/RUN_ID.jsonl``: its first record
names the work item, its last decision the status), a ``choir verify`` by its session
manifest (``runs/RUN_ID/manifest.json``). Neither needs the checkpoint database, so the list
never imports LangGraph.

The index is kept in memory between requests. Run folders and their manifests are
write-once, so a folder whose manifest has been read is never read again (only a folder
still without one is looked at next time); trace files grow while a run runs, so each is
re-read only when its size or modification time changed (one that ended, every few seconds).
Ten thousand stored runs then cost three directory listings per request (runs, traces,
plans) and a stat per plan (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from choir.trace.record import MAX_RECORD_LINE, traces_dir
from choir.view.plans import plan_summary

_TAIL = 64 << 10  # the last records of a trace file: where its status is
RECHECK_S = 10.0  # how often a trace that ended is looked at again (a resume appends to it)
FINAL = frozenset({"asserted", "halted", "rejected", "split"})


@dataclass(frozen=True)
class RunRow:
    """One line of the run list (everything shown is read from the stores)."""

    run_id: str
    kind: str  # "run" (choir run), "verify" (choir verify) or "plan" (choir plan run)
    status: str
    work_item: str
    mood: str
    started: str
    updated: str
    tree_hash: str = ""
    seal: str = ""  # a verify session's: its seal's verdict, read when its page is shown


def _records(data: bytes) -> list[dict[str, Any]]:
    """The complete JSON records in ``data``; a torn or foreign line is skipped."""
    out = []
    for line in data.split(b"\n"):
        if not line.strip() or len(line) > MAX_RECORD_LINE:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _trace_row(path: Path, size: int) -> RunRow | None:
    from choir.exceptions import IntegrityError
    from choir.verification.seal import open_record

    try:  # a FIFO or link swapped in since the lstat: never read
        with open_record(path) as fh:
            head = fh.read(min(size, MAX_RECORD_LINE))
            fh.seek(max(0, size - _TAIL))
            tail = fh.read(_TAIL)
    except (OSError, IntegrityError):
        return None
    first = _records(head.split(b"\n", 1)[0])
    if not first or first[0].get("kind") != "run_started":
        return None
    data = first[0].get("data") or {}
    status, mood, updated = "running", str(data.get("mood") or ""), str(first[0].get("ts"))
    tree = ""
    for rec in _records(tail):
        rdata: dict[str, Any] = rec["data"] if isinstance(rec.get("data"), dict) else {}
        if rec.get("kind") in ("decision", "run_ended", "awaiting_approval") and \
                rdata.get("status"):
            status = str(rdata["status"])
        if rdata.get("mood"):
            mood = str(rdata["mood"])
        if isinstance(rdata.get("tree_hash"), str):  # the executor's last candidate tree
            tree = rdata["tree_hash"]
        updated = str(rec.get("ts") or updated)
    return RunRow(run_id=path.stem, kind="run", status=status,
                  work_item=str(data.get("work_item") or ""), mood=mood,
                  started=str(first[0].get("ts")), updated=updated, tree_hash=tree)


def _session_row(run_id: str, manifest: Path) -> RunRow | None:
    """A verify session's row; None for any other run folder (a verifier's own), and for a
    record that is a link or a FIFO (``read_session``)."""
    from choir.verification.session import read_session

    data = read_session(manifest.parent)
    if data is None:
        return None
    return RunRow(run_id=run_id, kind="verify", status=str(data.get("status") or ""),
                  work_item="", mood=str(data.get("mood") or ""),
                  started=str(data.get("timestamp_start") or ""),
                  updated=str(data.get("timestamp_end") or ""),
                  tree_hash=str(data.get("tree_hash") or ""))


class RunIndex:
    """The run list of one home and artifact store, refreshed incrementally on each call."""

    def __init__(self, home: Path, artifacts_root: Path) -> None:
        self.traces = traces_dir(home)
        self.runs = artifacts_root / "runs"
        self.plans = home / "plans"
        self._plans: dict[str, tuple[int, int, RunRow]] = {}
        self._folders: dict[str, RunRow | None] = {}  # read once: folders are write-once
        self._traces: dict[str, tuple[int, int, RunRow | None]] = {}
        self._changed = True
        self._last_full = float("-inf")
        self._sorted: list[RunRow] = []
        self._items: list[str] = []

    def _scan_folders(self) -> None:
        try:
            names = os.listdir(self.runs)
        except OSError:
            return
        for name in names:
            if name in self._folders:
                continue
            manifest = self.runs / name / "manifest.json"
            if os.path.lexists(manifest):  # sealed: its row never changes
                self._folders[name] = _session_row(name, manifest)
                self._changed = True

    def _scan_traces(self) -> None:
        """New trace files, and those that may have grown: a run still going is looked at on
        every call, an ended one (its status is final) every ``RECHECK_S`` seconds, in case
        it was resumed."""
        now = time.monotonic()
        full = now - self._last_full >= RECHECK_S
        if full:
            self._last_full = now
        try:
            names = os.listdir(self.traces)
        except OSError:
            return
        for name in names:
            known = self._traces.get(name)
            if not name.endswith(".jsonl") or (known is not None and not full and
                                               known[2] is not None and
                                               known[2].status in FINAL):
                continue
            path = self.traces / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if known is None or known[:2] != (st.st_size, st.st_mtime_ns):
                self._traces[name] = (st.st_size, st.st_mtime_ns, _trace_row(path, st.st_size))
                self._changed = True

    def _scan_plans(self) -> None:
        """Plan records: rewritten after every transition, so each is re-read when its size
        or modification time changed; one that cannot be read is an ``unreadable`` row."""
        try:
            names = os.listdir(self.plans)
        except OSError:
            names = []
        for gone in set(self._plans) - set(names):
            del self._plans[gone]
            self._changed = True
        for name in names:
            try:
                st = os.lstat(self.plans / name / "state.json")
                key = (st.st_size, st.st_mtime_ns)
            except OSError:
                key = (-1, -1)
            known = self._plans.get(name)
            if known is not None and known[:2] == key:
                continue
            status, updated = plan_summary(self.plans.parent, name)
            self._plans[name] = (*key, RunRow(run_id=name, kind="plan", status=status,
                                              work_item="", mood="", started="",
                                              updated=updated))
            self._changed = True

    def rows(self) -> list[RunRow]:
        """Every run and plan, newest first (by its last update)."""
        self._scan_folders()
        self._scan_traces()
        self._scan_plans()
        if self._changed:  # sorted once per change, not per request
            found = [r for r in self._folders.values() if r is not None]
            found += [t[2] for t in self._traces.values() if t[2] is not None]
            found += [p[2] for p in self._plans.values()]
            self._sorted = sorted(found, key=lambda r: (r.updated, r.run_id), reverse=True)
            self._items = sorted({r.work_item for r in found if r.work_item})
            self._changed = False
        return self._sorted

    def select(self, *, kind: str = "", status: str = "", work_item: str = "",
               query: str = "") -> list[RunRow]:
        """The rows matching every filter given (``query``: part of the run id)."""
        status = status.lower()
        rows = self.rows()
        if not (kind or status or work_item or query):
            return rows
        return [r for r in rows
                if (not kind or r.kind == kind) and (not status or r.status.lower() == status)
                and (not work_item or r.work_item == work_item)
                and (not query or query in r.run_id)]

    def work_items(self) -> list[str]:
        """The work items of the runs listed by the last ``rows`` call."""
        return self._items
