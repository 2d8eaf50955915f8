"""The trace of a durable ``choir.Agent`` run, built from what its ContextStore saved.

The saved context holds the conversation: each tool call the model made (with its id) and
each reply (naming that id), so linkage comes from the stored record itself. The store also
notes when each save happened and how many messages it held; a message's ``ts`` is that of
the first save that held it. The messages are stored in the artifact store as JSON lines (one
message per line), and the run's accepted output is a claim citing the lines of the final call
and its acceptance, so it is grounded by span and hash like a report's claims.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from datetime import datetime
from typing import TYPE_CHECKING, Any

from choir._core.canonical import blake3_hex, canonical_json
from choir.exceptions import UserError
from choir.trace.model import (
    PLAN_SCHEMA_VERSION,
    TRACE_SCHEMA_VERSION,
    DerivedClaim,
    EvidenceFile,
    InsufficientEvidence,
    Trace,
    TraceCitation,
    TraceEvent,
    TraceOutcome,
    TracePlan,
)

if TYPE_CHECKING:
    from choir.agent.store import SqliteContextStore
    from choir.evidence.artifacts import ArtifactStore

FINAL = "final_output"
_MAX_ID = 64  # a model's tool-call id kept as it is; a longer one is named by its digest


def _calls(message: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        out.append((str(call.get("id") or ""), str(function.get("name") or "")[:200]))
    return out


def _short(model_id: str) -> str:
    """``model_id`` if short, else a digest of it: the model chooses its ids, and one of 250
    characters passed a trace event's 200 and crashed the export (review 20b)."""
    if len(model_id) <= _MAX_ID:
        return model_id
    return "blake3:" + blake3_hex(model_id.encode("utf-8", "surrogatepass"))[:32]


def export_agent(run_id: str, contexts: SqliteContextStore, store: ArtifactStore) -> Trace:
    """The trace of agent run ``run_id`` saved in ``contexts``.

    Raises:
        UserError: ``contexts`` holds no run ``run_id``.
    """
    ctx = contexts.load(run_id)
    saves = contexts.saves(run_id)
    if ctx is None or not saves:
        raise UserError(f"no agent run {run_id!r} in {contexts.path}; give the run id an "
                        "Agent.run(..., run_id=, store=) call used")
    lines = b"".join(canonical_json(m) + b"\n" for m in ctx.messages)
    digest = store.ingest_bytes(lines)
    counts = [n for n, _ in saves]
    stamps = [datetime.fromisoformat(ts) for _, ts in saves]

    def ts_of(index: int) -> datetime:  # the first save holding message ``index``
        at = bisect_right(counts, index)
        return stamps[min(at, len(stamps) - 1)]

    events: list[TraceEvent] = []

    def event(kind: str, ts: datetime, **fields: Any) -> int:
        events.append(TraceEvent(seq=len(events) + 1, kind=kind, ts=ts,  # type: ignore[arg-type]
                                 **fields))
        return len(events)

    event("run_started", stamps[0], name=run_id)
    names: dict[str, str] = {}
    final: tuple[int, int] | None = None  # lines of the accepted final call and its reply
    final_call: dict[str, int] = {}
    turn: dict[str, str] = {}  # the latest assistant turn: model id -> trace call id
    for index, message in enumerate(ctx.messages):
        line, when = index + 1, ts_of(index)
        if message.get("role") == "assistant":
            # a model may reuse ids across turns; a reply answers the latest turn's call, so
            # the trace's call id is the turn's line plus the model's id
            turn = {}
            for model_id, name in _calls(message):
                turn[model_id] = call_id = f"L{line}/{_short(model_id)}"
                names[call_id] = name
                event("tool_call", when, call_id=call_id, name=name, data={"line": line})
                if name == FINAL:
                    final_call[call_id] = line
        elif message.get("role") == "tool":
            model_id = str(message.get("tool_call_id") or "")
            call_id = turn.get(model_id, f"unanswerable/{_short(model_id)}")
            event("tool_result", when, call_id=call_id or None,
                        name=names.get(call_id, ""), data={"line": line})
            if call_id in final_call and message.get("content") == "accepted":
                final = (final_call[call_id], line)
    end = stamps[-1]
    claims: list[DerivedClaim] = []
    insufficient = None
    if ctx.status == "completed" and final is not None:
        first, last = final
        seq = event("model_output", end, name=FINAL, data={"line": last})
        text = json.dumps(ctx.output, default=str, sort_keys=True)[:1800].replace("[@", "[ @")
        claims.append(DerivedClaim(
            id=f"{run_id}/output", kind="output", text=f"output: {text} [@1]", event_seq=seq,
            citations=(TraceCitation(artifact=digest, line_start=first, line_end=last,
                                     span_hash=store.span_hash(digest, first, last)),)))
    elif ctx.status != "running":
        why = f"the agent run ended {ctx.status} without an accepted output: {ctx.error or ''}"
        insufficient = InsufficientEvidence(reason=why[:2000])
        event("insufficient_evidence", end, data={"reason": why[:2000]})
    if ctx.status != "running":
        event("run_ended", end, data={"status": ctx.status, "reason": ctx.error or ""})
    return Trace(schema_version=TRACE_SCHEMA_VERSION, run_id=run_id, source="agent",
                 plan=TracePlan(schema_version=PLAN_SCHEMA_VERSION),
                 events=tuple(events), claims=tuple(claims),
                 evidence=(EvidenceFile(hash=digest, role="agent_context",
                                        name=f"{run_id}/messages.jsonl"),),
                 outcome=TraceOutcome(status=ctx.status, reason=(ctx.error or "")[:2000],
                                      insufficient_evidence=insufficient))
