"""The trace of one run (docs/trace.md): a single JSON document an auditor can check offline.

A trace holds what happened in order (events with ``seq`` and ``ts``), every tool call and its
result linked by ``call_id``, the plan (planned and required steps), every derived claim with
the citations that ground it (artifact hash, line span, span hash), and the evidence files by
hash. Nothing in it is taken on trust: ``choir.trace.verify`` re-derives every span hash and
evidence hash from the artifact store.

Bounds are part of the format: a trace is hostile input, so every collection and string has
a cap, and event data holds only flat scalars (or short lists of strings), never nested
objects.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from choir.models._base import Frozen
from choir.verification.seal import Seal

TRACE_SCHEMA_VERSION = 1
PLAN_SCHEMA_VERSION = 1
SUPPORTED_TRACE_VERSIONS = frozenset({TRACE_SCHEMA_VERSION})
SUPPORTED_PLAN_VERSIONS = frozenset({PLAN_SCHEMA_VERSION})
TRACE_TYPE: Literal["choir.trace/v1"] = "choir.trace/v1"

MAX_EVENTS = 500_000
MAX_CLAIMS = 50_000
MAX_EVIDENCE = 50_000
MAX_CITATIONS = 32
MAX_TEXT = 2000

Hash = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Short = Annotated[str, Field(max_length=MAX_TEXT)]
Scalar = Short | int | float | bool | None
Value = Scalar | Annotated[tuple[Annotated[str, Field(max_length=200)], ...],
                           Field(max_length=256)]

EventKind = Literal[
    "run_started",  # data: work_item, required (verifier names), mood
    "run_resumed",
    "plan",  # data: plan (number), verifiers ("name#replica"), lenses, dropped, reason
    "tool_call",  # call_id; name: the tool (executor, a verifier, an agent tool)
    "tool_result",  # call_id; data: result, report_hash, manifest_hash, output, ...
    "attestation",  # name: attestation id; data: call (the verifier call it attests)
    "decision",  # data: status, reason, mood, asserted
    "model_output",  # an Agent's final answer or verification verdict
    "awaiting_approval",
    "insufficient_evidence",  # data: reason
    "run_ended",  # data: status, reason
]


class TraceEvent(Frozen):
    """One thing that happened. ``seq`` counts from 1 without gaps; ``ts`` never goes back."""

    seq: int
    kind: EventKind
    ts: datetime
    call_id: str | None = Field(default=None, min_length=1, max_length=200)
    name: str = Field(default="", max_length=200)
    data: dict[Annotated[str, Field(max_length=64)], Value] = Field(default_factory=dict,
                                                                    max_length=32)


class PlannedStep(Frozen):
    """A verifier a plan chose: plan number, verifier, replica and lens."""

    plan: int = Field(ge=1)
    name: str = Field(max_length=64)
    replica: int = Field(default=0, ge=0)
    lens: str = Field(default="default", max_length=32)


class TracePlan(Frozen):
    """What had to happen: ``required`` verifiers must each have a result; every ``planned``
    step must have a call and a result."""

    schema_version: int
    required: tuple[Annotated[str, Field(max_length=64)], ...] = Field(default=(),
                                                                        max_length=256)
    planned: tuple[PlannedStep, ...] = Field(default=(), max_length=MAX_EVENTS)


class TraceCitation(Frozen):
    """Lines ``line_start..line_end`` (1-based, inclusive) of an evidence file, and the blake3
    of exactly those bytes (``ArtifactStore.span_hash``). Bounds are checked by the verifier,
    not by the schema, so a bad span is reported as ``citation_span``."""

    artifact: Hash
    line_start: int
    line_end: int
    span_hash: Hash


ClaimKind = Literal["report_summary", "failure_signature", "ASSERT", "HYPOTHESIZE",
                    "HYPERTHESIS", "output"]


class DerivedClaim(Frozen):
    """A claim the run made. ``text`` carries a marker ``[@n]`` for each citation ``n``
    (1-based); ``insufficient`` marks a claim the run could not ground (docs/trace.md)."""

    id: str = Field(min_length=1, max_length=200)
    kind: ClaimKind
    text: str = Field(max_length=MAX_TEXT)
    event_seq: int
    citations: tuple[TraceCitation, ...] = Field(default=(), max_length=MAX_CITATIONS)
    insufficient: bool = False


class EvidenceFile(Frozen):
    """A stored artifact the trace relies on, by blake3; re-hashed by the verifier."""

    hash: Hash
    role: Literal["report", "manifest", "log", "file", "executor_output", "agent_context"]
    name: str = Field(default="", max_length=300)


class InsufficientEvidence(Frozen):
    """The explicit output of a run that ended without evidence enough to decide."""

    reason: str = Field(max_length=MAX_TEXT)


class TraceOutcome(Frozen):
    status: str = Field(max_length=64)
    reason: str = Field(default="", max_length=MAX_TEXT)
    insufficient_evidence: InsufficientEvidence | None = None


class Trace(Frozen):
    """The whole trace of one run. ``schema_version`` comes first in the JSON."""

    schema_version: int
    type: Literal["choir.trace/v1"] = TRACE_TYPE
    run_id: str = Field(min_length=1, max_length=200)
    source: Literal["run", "agent"]
    work_item: str | None = Field(default=None, max_length=200)
    plan: TracePlan
    events: tuple[TraceEvent, ...] = Field(max_length=MAX_EVENTS)
    # the recorder's signed chain heads over ``events`` (choir.trace.chain); a run's trace
    # without them vouches for nothing
    seals: tuple[Seal, ...] = Field(default=(), max_length=MAX_EVENTS)
    claims: tuple[DerivedClaim, ...] = Field(default=(), max_length=MAX_CLAIMS)
    evidence: tuple[EvidenceFile, ...] = Field(default=(), max_length=MAX_EVIDENCE)
    outcome: TraceOutcome


def trace_json_schema() -> dict[str, Any]:
    """The published JSON Schema (``docs/trace.schema.json``), generated from the models."""
    schema = Trace.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://choir.dev/schemas/trace-v1.json"
    schema["properties"]["schema_version"]["enum"] = sorted(SUPPORTED_TRACE_VERSIONS)
    schema["$defs"]["TracePlan"]["properties"]["schema_version"]["enum"] = sorted(
        SUPPORTED_PLAN_VERSIONS)
    return schema
