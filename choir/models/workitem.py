"""Work items, moods and executors: what the user asks Choir to get done."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from choir.models._base import Frozen


class Mood(StrEnum):
    """How strict verification is. CURIOUS is a transition target (reframe): docs/concepts.md."""

    CALM = "CALM"
    SKEPTICAL = "SKEPTICAL"
    PARANOID = "PARANOID"
    BOLD = "BOLD"
    CURIOUS = "CURIOUS"


class BlastRadius(StrEnum):
    """How far a change reaches; a policy may ask for human approval above a radius."""

    SMALL = "small"
    MEDIUM = "medium"
    LARGE = "large"


class ExecutorSpec(Frozen):
    """How the working tree gets changed.

    ``command``: a shell command run in the repo. ``python``: ``module:function``.
    ``llm``: a Choir Agent with file tools scoped to the repo.

    ``command`` and ``python`` run the user's code, so they run in a sandbox (bubblewrap)
    with the repo writable and Choir's keys and stores out of sight. ``sandbox: none`` is the
    explicit trust mode for local development: unsandboxed, recorded as executor isolation
    ``none`` in every attestation of the run, and refused by PARANOID. ``network`` is off
    unless the work item turns it on.
    """

    schema_version: Literal[1] = 1
    # an executor's name: command, python, llm, or a plugin's (``choir.executors`` entry
    # point); checked against the registry when the work item file loads
    kind: str = Field(default="command", pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
    command: str | None = None
    function: str | None = None
    model: str | None = None
    instructions: str | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    sandbox: Literal["auto", "bwrap", "none"] = "auto"
    network: bool = False
    max_turns: int = Field(default=30, ge=1, le=500)
    # llm: output tokens per model turn (a slow local model writes ~10-100 a second)
    max_tokens: int = Field(default=4096, ge=16, le=65536)
    verifier_max_attempts: int = Field(default=3, ge=1, le=50)


class WorkItem(Frozen):
    """One unit of work: a goal, a repo, and the bounds Choir works within."""

    schema_version: Literal[1] = 1
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._~-]{0,127}$")  # ~: parts only
    goal: str
    repo: str
    mood: Mood = Mood.CALM
    max_attempts: int = Field(default=4, ge=1, le=100)
    scope: tuple[str, ...] = ()
    blast_radius: BlastRadius = BlastRadius.SMALL
    required_verifiers: tuple[str, ...] = ()
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    escalate_to: ExecutorSpec | Literal["human"] | None = None
    """Who takes the work item when the loop cannot satisfy it (the same failure that does
    not divide, evidence that stays inconclusive): a stronger executor (or the same kind
    with a stronger ``model``), for what is left of ``max_attempts``, or ``human``: the run
    waits for a person (``choir approve RUN_ID [--reject]``) with the evidence attached.
    Unset: the policy's ``escalate_to``, else the run halts."""
    split_of: str | None = None
    """Set on a part of a split work item: the parent's id. A part verifies only its own
    required verifiers (narrowed to ``focus`` tests where the verifier can isolate them)."""
    focus: tuple[str, ...] = ()
    decision_type: str | None = None
    """A ``decisions:`` entry of ``choir.yaml``: above its blast-radius threshold, its
    verification methods are required before anything is ASSERTed."""
    may_change_spec: tuple[str, ...] = ()
    """Spec paths or globs (``choir.yaml`` ``spec:``) this work item's goal needs to add or
    change: new files there are verified as extra evidence beside the pinned checks; a
    change to a pinned file is refused, or held for a person (the mood's ``spec_change``)."""
    action: dict[str, Any] = Field(default_factory=dict)
    """What the action did (ids, values written), handed to postconditions as
    ``context["action"]``: named SQL parameters and expected values come from here."""
