"""Work items, moods and executors: what the user asks Choir to get done."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, field_validator

from choir._core.hosts import normalise_hosts
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

    ``agent``: an agent program (Claude Code, Codex, aider, opencode: ``uses: NAME`` fills
    the fields from ``policies/agents.yaml``) run as a command with the work item and the
    bounded feedback as a prompt (``CHOIR_PROMPT_FILE``).

    ``command``, ``python`` and ``agent`` run the user's code, so they run in a sandbox
    (bubblewrap) with the repo writable and Choir's keys and stores out of sight.
    ``sandbox: none`` is the explicit trust mode for local development: unsandboxed,
    recorded as executor isolation ``none`` in every attestation of the run, and refused by
    PARANOID. ``network`` is off unless the work item turns it on; ``hosts`` lets through
    only those endpoints (Choir's egress proxy), whatever ``network`` says.
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
    # The fields below are absent from the JSON when empty, so a work item saved before
    # they existed reads and hashes as it did.
    # the only endpoints the executor may reach (``host[:port]``, port 443 by default)
    hosts: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)
    # the only variables of Choir's environment the executor sees, by name (``agent``
    # always works so; ``command`` and ``python`` see all but Choir's own when this is empty)
    pass_env: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)
    # variables set for the executor (after ``pass_env``)
    env: dict[str, str] = Field(default_factory=dict, exclude_if=lambda v: not v)
    # extra folders the executor's sandbox sees read-only (where an agent program is
    # installed outside /usr); never one holding CHOIR_HOME, the artifact store or $HOME
    binds: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)

    @field_validator("hosts")
    @classmethod
    def _normal_hosts(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        return normalise_hosts(hosts)

    @field_validator("pass_env")
    @classmethod
    def _variable_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            _check_variable(name)
        return names

    @field_validator("env")
    @classmethod
    def _variables(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            _check_variable(name)
        return env


_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _check_variable(name: str) -> None:
    """A variable an executor may be given: a plain name, none of Choir's own settings."""
    if not _VARIABLE.match(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    if name.startswith("CHOIR_") or name == "AGENT_ARTIFACT_DIR":
        raise ValueError(f"{name} is Choir's own setting: an executor never gets it")


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
