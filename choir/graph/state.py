"""Graph state. Explicit, importable types only, so checkpoints round-trip from a fresh process.

Nothing here can hold raw verifier output: green threads return ``VerifierRun`` (bounded
report + hashes) and the executor's output lives in the artifact store, referenced by hash.
"""

from __future__ import annotations

import operator
from typing import Annotated

from typing_extensions import TypedDict

from choir.models import PlannedVerifier, Target, Usage, VerificationReport, WorkItem
from choir.verification import VerifierRun


class RunState(TypedDict, total=False):
    work_item: WorkItem
    run_id: str
    mood: str
    attempt: int
    reruns: int
    round: int
    target: Target
    executor_output: str
    runs: Annotated[list[VerifierRun], operator.add]
    attestations: list[str]
    feedback: list[VerificationReport]
    history: list[list[str]]
    events: Annotated[list[str], operator.add]
    usage: Annotated[list[tuple[str, Usage]], operator.add]  # (role, spend), appended per call
    status: str
    reason: str
    asserted: str


class GreenIn(TypedDict):
    """A green thread's input: which verifier, on which exact tree."""

    work_item: WorkItem
    planned: PlannedVerifier
    target: Target
    run_id: str


class GreenOut(TypedDict):
    """The only key that flows back to the parent graph."""

    runs: list[VerifierRun]


def checkpoint_types() -> list[tuple[str, str]]:
    """Every Choir type a checkpoint may hold, allowed explicitly for LangGraph's msgpack."""
    from choir import models

    names = ["Mood", "BlastRadius", "WorkItem", "ExecutorSpec", "Target", "Result",
             "VerificationReport", "FailureSignature", "Citation", "Counts", "Usage",
             "PlannedVerifier"]
    found = [(getattr(models, n).__module__, n) for n in names]
    return [*found, (VerifierRun.__module__, "VerifierRun")]
