"""Graph state. Explicit, importable types only, so checkpoints round-trip from a fresh process.

Nothing here can hold raw verifier output: green threads return ``VerifierRun`` (bounded
report + hashes) and the executor's output lives in the artifact store, referenced by hash.
"""

from __future__ import annotations

import operator
from typing import Annotated, Literal, NotRequired

from typing_extensions import TypedDict

from choir import config, models
from choir.config import RepoConfig, policy
from choir.config.policy import Policy
from choir.models import (
    ParentFrame,
    PlannedVerifier,
    SpecChange,
    Target,
    Usage,
    VerificationReport,
    VerifierPlan,
    VerifierRun,
    WorkItem,
)

# primary: the plan after an execution; nested: other lenses on flaky or ambiguous evidence;
# broaden: BOLD's wider coverage once the core is green. All on the same tree.
RoundKind = Literal["primary", "nested", "broaden"]


class RunState(TypedDict, total=False):
    work_item: WorkItem  # the item being worked on: the run's, or a part of it after a split
    # pinned when the run starts: an executor that rewrites choir.yaml changes nothing here
    config: RepoConfig
    policy: Policy
    # the pinned spec: the hash of its manifest in the artifact store (choir.evidence.spec),
    # pinned from the tree the run started on; replaced only by a person's approval
    spec: str | None
    spec_change: SpecChange | None  # the current tree's spec against the pin, judged
    # the base tree's Python files, pinned like the spec: what a mutation check diffs against
    base: str | None
    floor: list[str]  # verifiers earlier primary rounds ran: a later plan never drops one
    run_id: str
    mood: str
    attempt: int  # executor attempts of the current work item (or part)
    # the one attempt budget: executor runs of the run's work item and every part split from
    # it, and the ceiling (the run's work item's max_attempts), checkpointed with the rest
    spent: int
    budget: int
    switches: int  # mood switches so far (bounded by the policy's max_mood_switches)
    escalated: bool  # the work item was handed to its escalate_to executor already
    escalation: dict[str, object] | None  # what a person is asked to take, with the evidence
    round: int
    round_kind: RoundKind
    nested: int  # nested rounds spent on this tree
    target: Target
    executor_output: str  # the executor's log: an artifact hash, never its bytes
    executor_exit: int | None  # None: an executor without a process (llm)
    executor_timed_out: bool
    executor_isolation: str  # namespace | none | tools; recorded in every attestation
    plan: VerifierPlan
    runs: Annotated[list[VerifierRun], operator.add]  # every run on this tree
    attestations: dict[str, str]  # green-thread run id -> attestation id, this tree
    feedback: list[VerificationReport]
    history: list[list[str]]
    events: Annotated[list[str], operator.add]
    usage: Annotated[list[tuple[str, Usage]], operator.add]  # (role, spend), appended per call
    parts: list[WorkItem]  # parts still to do after the current one
    # a plan item's run: a split ends the run with its parts (status "split") for the plan
    # driver to add as items of their own, instead of running them one after another here
    hand_back: bool
    parent: ParentFrame | None
    split_done: bool
    status: str
    reason: str
    asserted: str
    # a done work item above the approval radius: what its ASSERT will be written with once
    # a person approves (its round's key and the verifiers it requires), nothing before
    held: dict[str, object] | None


def budget_left(state: RunState) -> tuple[int, int]:
    """(executor runs spent, the ceiling) of the run's one attempt budget."""
    item = state["work_item"]
    frame = state.get("parent")
    ceiling = state.get("budget") or (frame.root.item if frame is not None else item).max_attempts
    return state.get("spent", 0), ceiling


def charge(state: RunState) -> dict[str, int]:
    """The state update of one more executor run; refuses one past the ceiling.

    The Director never asks for one (it checks the budget before a retry or a split), so
    this is the last line: a fault, never a silent overrun.
    """
    from choir.exceptions import ChoirError

    spent, ceiling = budget_left(state)
    if spent >= ceiling:
        raise ChoirError(f"attempt budget spent ({spent}/{ceiling}): no further executor run "
                         f"for {state['work_item'].id}")
    return {"spent": spent + 1, "budget": ceiling}


class GreenIn(TypedDict):
    """A green thread's input: which verifier, through which lens, on which exact tree."""

    work_item: WorkItem
    config: RepoConfig
    policy: Policy
    planned: PlannedVerifier
    target: Target
    run_id: str
    mood: str
    spec: str | None
    spec_change: SpecChange | None
    base: NotRequired[str | None]
    # the run's own snapshot folder (``run_snapshots``); absent in a send checkpointed before
    # runs had one: the shared folder, where that run's snapshot is
    snapshots: NotRequired[str]


class GreenOut(TypedDict):
    """The only key that flows back to the parent graph."""

    runs: list[VerifierRun]


def checkpoint_types() -> list[tuple[str, str]]:
    """Every Choir type a checkpoint may hold, allowed explicitly for LangGraph's msgpack."""

    names = ["Mood", "BlastRadius", "WorkItem", "ExecutorSpec", "Target", "Result",
             "VerificationReport", "FailureSignature", "Citation", "Counts", "Usage",
             "PlannedVerifier", "VerifierPlan", "VerifierSpec", "VerifierKind", "StepSpec",
             "Limits", "Lenses", "VerifierRun", "ParentFrame", "ExecutorOutput", "SpecChange",
             "HeldOut", "PlanRecord", "PlanRow", "QueueEntry", "PartSpec", "Spend"]
    found = [(getattr(models, n).__module__, n) for n in names]
    found += [(config.__name__, n) for n in ("RepoConfig", "ModelsConfig", "SandboxConfig",
                                             "MoodOverride")]
    found += [(policy.__name__, n) for n in ("Policy", "MoodPolicy")]
    found += [("choir.postconditions.decisions", n) for n in ("Decision",
                                                             "DecisionVerification")]
    return found
