"""Recording a ``choir run``'s trace while it runs: one JSON line per event, sealed.

What the stored records alone cannot say is recorded here: the order things happened in,
when, and which result answers which call (call ids). Everything else (reports, manifests,
attestations, AHDB claims) is read back from the stores at export time.

The record is evidence (``choir.trace.chain``): each event line is the event's canonical JSON,
the events form a hash chain, and after each node of the run the recorder appends a seal
line, the chain's head signed with the home's key. A node's events are appended in one
``write`` and its seal in the next, so a crash leaves either a sealed record or one node's
events unsealed; a resumed run seals them with its first seal (a torn last line, which only
a failing disk leaves, is cut first), after checking that nothing sealed was changed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from choir._core.canonical import canonical_json
from choir._core.failpoints import failpoint
from choir._core.paths import choir_home
from choir.exceptions import IntegrityError, UserError
from choir.trace.chain import chain_heads, chain_next, chain_start, check_seals
from choir.trace.model import TraceEvent
from choir.verification.seal import Seal, make_seal, open_record

if TYPE_CHECKING:
    from choir.attest import SigningKey

MAX_RECORD_LINE = 64 << 10
SEAL_LINE = "seal"  # a line ``{"kind": "seal", "seal": {...}}``; every other line is an event


def traces_dir(home: Path | None = None) -> Path:
    return (home or choir_home()) / "traces"


def record_path(run_id: str, home: Path | None = None) -> Path:
    return traces_dir(home) / f"{run_id}.jsonl"


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """The recorded lines of a run (events and seals), in order.

    Raises:
        IntegrityError: a line is not a JSON object (a torn or edited record).
    """
    with open_record(path) as fh:
        for number, line in enumerate(iter(lambda: fh.readline(MAX_RECORD_LINE + 1), b""), 1):
            try:
                if len(line) > MAX_RECORD_LINE:  # read no further: a planted giant line
                    raise ValueError("line too long")
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                raise IntegrityError(f"{path}:{number}: not a trace record ({exc})") from None
            yield record


def read_trace(path: Path) -> tuple[list[TraceEvent], list[Seal]]:
    """A run's recorded events and the seals over them.

    Raises:
        IntegrityError: a line is not an event or a seal.
    """
    events: list[TraceEvent] = []
    seals: list[Seal] = []
    for number, rec in enumerate(read_records(path), 1):
        try:
            if rec.get("kind") == SEAL_LINE:
                seals.append(Seal.model_validate(rec.get("seal")))
            else:
                events.append(TraceEvent.model_validate(rec))
        except ValueError as exc:
            raise IntegrityError(f"{path}:{number}: not a trace event or seal "
                                 f"({str(exc)[:300]})") from None
    return events, seals


def _cut_torn_line(path: Path) -> None:
    """Drop a last line without its newline: a write the disk did not finish (never sealed)."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    size = os.fstat(fd).st_size
    with os.fdopen(fd, "rb+") as fh:
        if not size:
            return
        fh.seek(max(0, size - MAX_RECORD_LINE - 1))
        tail = fh.read()
        if tail.endswith(b"\n"):
            return
        cut = tail.rfind(b"\n")
        if cut < 0 and len(tail) < size:
            raise IntegrityError(f"{path}: the last line is longer than a trace record")
        fh.truncate(size - len(tail) + cut + 1)


class TraceRecorder:
    """Appends a run's events to ``CHOIR_HOME/traces/RUN_ID.jsonl`` and seals them.

    ``node`` turns each orchestrator node's state update into events: the executor and each
    verifier become a ``tool_call`` and its ``tool_result`` under one call id (the green
    thread's run id for a verifier), plans number themselves, and attestations are linked to
    the verifier call they attest. ``started``, ``node`` and ``ended`` each write their events
    at once and then seal them (``signer``: the home's, loaded when first needed).
    """

    def __init__(self, run_id: str, home: Path | None = None,
                 signer: SigningKey | None = None) -> None:
        self.run_id = run_id
        self.home = home
        self.path = record_path(run_id, home)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.seq = 0
        self.plans = 0
        self.executions = 0
        self.attested: set[str] = set()
        self.called: set[str] = set()  # call ids recorded (a green thread's is its run id)
        self.last_round: list[str] = []  # results of the current plan's voting runs
        self.head = chain_start(run_id)
        self._signer = signer
        self._batch: list[bytes] = []
        if self.path.exists():
            self._reopen()

    def _reopen(self) -> None:
        """Take up a record a stopped run left: its sealed part must be as it was sealed.

        Raises:
            UserError: an event was changed, dropped or reordered after it was sealed (exit
                2: resuming would seal the change as if the run had made it).
        """
        try:
            _cut_torn_line(self.path)
            events, seals = read_trace(self.path)
        except (IntegrityError, OSError) as exc:
            raise UserError(f"the trace of run {self.run_id} is unreadable: {exc}\n  fix: "
                            "`choir audit` names it; restore the record, or start the work "
                            "item as a new run") from None
        from choir.attest import trusted_key_ids

        # the very check audit makes (signatures too: seals re-made over a changed record
        # would otherwise be vouched for by the resumed run's first, genuine seal)
        broken = [detail for check, _, detail in check_seals(
            self.run_id, events, seals, trusted_key_ids(self.home)) if check != "seal_coverage"]
        if broken:
            raise UserError(
                f"{self.path}: the trace of run {self.run_id} was changed after it was sealed "
                f"({broken[0][:300]}); a run is not resumed on a changed record\n  fix: "
                "`choir audit` names the change; restore the record, or start the work item "
                "as a new run")
        for event in events:
            self._replay(event.model_dump(mode="json"))
        self.head = chain_heads(self.run_id, events)[-1]

    def _replay(self, rec: dict[str, Any]) -> None:
        self.seq = int(rec.get("seq", self.seq))
        kind, data = rec.get("kind"), rec.get("data") or {}
        if kind == "plan":
            self.plans += 1
            self.last_round = []
        elif kind == "tool_call" and rec.get("name") == "executor":
            self.executions += 1
        if kind == "tool_call" and rec.get("call_id"):
            self.called.add(str(rec["call_id"]))
        elif kind == "attestation":
            self.attested.add(str(rec.get("name")))
        elif kind == "tool_result" and "result" in data and not data.get("diagnostic"):
            self.last_round.append(str(data["result"]))

    def emit(self, kind: str, *, name: str = "", call_id: str | None = None,
             data: dict[str, Any] | None = None) -> None:
        """Add an event to the batch ``_commit`` writes and seals."""
        event = TraceEvent.model_validate({
            "seq": self.seq + 1, "kind": kind, "ts": datetime.now(UTC), "name": name,
            "call_id": call_id, "data": data or {}})
        self._batch.append(canonical_json(event) + b"\n")
        self.head = chain_next(self.head, event)
        self._replay(event.model_dump(mode="json"))

    def _append(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def _commit(self, node: bool = False) -> None:
        """Write the batch's events in one ``write``, then their seal in the next.

        ``node``: a node's events, written when the graph streams the node's update (for a
        Send task that can be before its write is saved: the resumed run runs it again and
        ``node`` records it once); a crash between the two writes (the ``trace:sealing``
        failpoint) leaves them unsealed.
        """
        if not self._batch:
            return
        self._append(b"".join(self._batch))
        self._batch = []
        if node:
            failpoint("trace:sealing")
        if self._signer is None:
            from choir.attest import load_signer

            self._signer = load_signer(self.home)
        seal = make_seal("trace", self.run_id, self.seq, self.head, self._signer)
        self._append(canonical_json({"kind": SEAL_LINE, "seal": seal.model_dump(mode="json")})
                     + b"\n")

    def started(self, start: Any) -> None:
        """A new run (``start`` is the graph input) or a resumed one (``start`` is not a dict)."""
        if isinstance(start, dict):
            item = start["work_item"]
            self.emit("run_started", name=item.id, data={
                "work_item": item.id, "mood": start.get("mood"),
                "required": list(item.required_verifiers)})
        else:
            self.emit("run_resumed")
        self._commit()

    def node(self, node: str, update: dict[str, Any]) -> None:
        if node == "execute":
            call = f"{self.run_id}/execute/{self.executions + 1}"
            self.emit("tool_call", name="executor", call_id=call,
                      data={"attempt": update.get("attempt"),
                            "isolation": update.get("executor_isolation")})
            target = update.get("target")
            self.emit("tool_result", name="executor", call_id=call, data={
                "exit_code": update.get("executor_exit"),
                "timed_out": bool(update.get("executor_timed_out")),
                "output": update.get("executor_output") or None,
                "tree_hash": target.tree_hash if target is not None else None})
        elif node == "direct" and update.get("plan") is not None:
            plan = update["plan"]
            self.emit("plan", name=f"plan {self.plans + 1}", data={
                "plan": self.plans + 1, "mood": plan.mood.value,
                "verifiers": [f"{p.name}#{p.replica}" for p in plan.verifiers],
                "lenses": [p.lens for p in plan.verifiers],
                "dropped": list(plan.dropped), "reason": plan.reason[:1000]})
        elif node == "green":
            # a green thread recorded before a crash its checkpoint did not see (LangGraph
            # streams a task's update before its write is saved) runs again and reuses its
            # sealed run: the same call, recorded once
            for run in [r for r in update.get("runs", []) if r.run_id not in self.called]:
                self.emit("tool_call", name=run.verifier, call_id=run.run_id, data={
                    "plan": self.plans, "replica": run.replica, "lens": run.lens,
                    "diagnostic": run.diagnostic})
                self.emit("tool_result", name=run.verifier, call_id=run.run_id, data={
                    "result": run.report.result.value, "diagnostic": run.diagnostic,
                    "report_hash": run.report_hash or None,
                    "manifest_hash": run.manifest_hash or None})
        elif node == "attest":
            for call, att_id in sorted((update.get("attestations") or {}).items()):
                if att_id not in self.attested:
                    self.emit("attestation", name=att_id, data={"call": call})
        elif node in ("adjudicate", "approve") and "status" in update:
            self.emit("decision", name=node, data={
                "status": update.get("status"), "reason": str(update.get("reason", ""))[:1000],
                "mood": update.get("mood"), "asserted": update.get("asserted") or None})
        self._commit(node=True)

    def ended(self, values: dict[str, Any], waiting: bool) -> str:
        """The run stopped: paused for approval, or ended. Returns its insufficient-evidence
        output (docs/trace.md), '' when the evidence decided the run."""
        status = str(values.get("status", "unknown"))
        if waiting:
            self.emit("awaiting_approval", data={"status": status})
            self._commit()
            return ""
        reason = str(values.get("reason", ""))[:1000]
        missing = insufficiency(status, self.last_round)
        if missing:
            self.emit("insufficient_evidence", data={"reason": missing})
        self.emit("run_ended", data={"status": status, "reason": reason})
        self._commit()
        return missing


    def failed(self, error: BaseException) -> None:
        """The run stopped on an error (a refused sandbox, a broken executor): it ended."""
        self.ended({"status": "error", "reason": f"{type(error).__name__}: {error}"[:1000]},
                   waiting=False)


def insufficiency(status: str, last_round: list[str]) -> str:
    """Why a run that ended without an ASSERT had too little evidence to decide, or ''.

    A run that ended on an attested FAIL was decided by evidence; one that ended (halted,
    budget spent) on INCONCLUSIVE or FLAKY results, or with no verifier result at all, was
    not, and says so rather than leave its claims looking grounded.
    """
    if status in ("asserted", "rejected", "running"):
        return ""
    if "FAIL" in last_round:
        return ""
    if not last_round:
        return f"the run ended ({status}) before any verifier reported"
    seen = ", ".join(sorted(set(last_round)))
    return f"the run ended ({status}) on results that decide nothing: {seen}"
