"""Verifier specifications (the allowlist) and the plans the Director draws from them."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, field_validator, model_validator

from choir._core.hosts import normalise_hosts
from choir.models._base import Frozen
from choir.models.workitem import Mood


class VerifierKind(StrEnum):
    """What a verifier checks."""

    UNIT_TESTS = "unit_tests"
    INTEGRATION_TESTS = "integration_tests"
    LINT = "lint"
    TYPECHECK = "typecheck"
    BUILD = "build"
    SMOKE = "smoke"
    UI_DIFF = "ui_diff"
    STATIC_ANALYSIS = "static_analysis"
    SECURITY_SCAN = "security_scan"
    POLICY_GATE = "policy_gate"
    PIPELINE = "pipeline"
    POSTCONDITION = "postcondition"  # a callable or scaffold checking an action's effect
    TRACE = "trace"  # the run's own trace, verified in-process (choir.trace.step)
    # the pinned tests run against mutants of the lines the executor changed (BOLD, PARANOID):
    # a mutant they do not kill is a change they do not test (choir.director.mutation)
    MUTATION = "mutation"


class StepSpec(Frozen):
    """One shell command of a verifier; steps run in order and stop at the first failure."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    command: str = Field(min_length=1)


class Limits(Frozen):
    """Resource limits applied by sandboxes that can enforce them."""

    memory_mb: int = Field(default=2048, gt=0)
    pids: int = Field(default=512, gt=0)
    cpus: float = Field(default=2.0, gt=0)
    # $CHOIR_OUT per run (temp, caches and home live there too); a step that writes more is
    # stopped and FAILs with this cap as the reason
    out_mb: int = Field(default=4096, gt=0)
    # files and folder depth in $CHOIR_OUT: each file is listed in the signed manifest, so
    # these bound its size (the ceilings keep it readable); over them the step FAILs
    out_files: int = Field(default=10_000, gt=0, le=20_000)
    out_depth: int = Field(default=32, gt=0, le=128)


class Lenses(Frozen):
    """How a verifier is looked at again when its result is flaky or ambiguous (docs/concepts.md).

    A clean rerun (the same steps in a fresh sandbox) needs no configuration. The others:

    Attributes:
        isolate: a command that runs only the tests named by ``{tests}`` (shell-quoted test
            ids); it replaces the verifier's last step. Without it there is no isolated-subset
            lens, and a split cannot narrow below whole verifiers.
        instrument_env: variables added for the instrumented lens (``CHOIR_LENS=instrumented``
            is always set), e.g. to turn on fault handlers or verbose logs.
        independent: another allowlisted verifier that checks the same claim by other means.
    """

    isolate: str | None = Field(default=None, min_length=1)
    instrument_env: dict[str, str] = Field(
        default_factory=lambda: {"PYTHONFAULTHANDLER": "1"})
    independent: str | None = None


class HeldOut(Frozen):
    """Where a held-out verifier's files live (outside the repo, never shown to the executor)
    and the blake3 of their manifest when the run's configuration was pinned: a verifier
    whose files changed since then verifies nothing (fail closed)."""

    path: str
    files_hash: str


class VerifierSpec(Frozen):
    """One allowlisted verifier. Only verifiers named in ``choir.yaml`` may ever run."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    kind: VerifierKind
    steps: tuple[StepSpec, ...] = Field(min_length=1)
    parser: str = "generic"
    timeout_s: float = Field(default=600.0, gt=0)
    network: bool = False
    limits: Limits = Field(default_factory=Limits)
    env: dict[str, str] = Field(default_factory=dict)
    lenses: Lenses = Field(default_factory=Lenses)
    # a held-out check (choir.config.heldout): its files are copied into the tree only this
    # verifier reads; its reports reach the executor as counts. Absent in the JSON when
    # unset, so the config hash of every other verifier is what it was.
    heldout: HeldOut | None = Field(default=None, exclude_if=lambda v: v is None)
    # a mutation check (kind mutation): the allowlisted verifier whose steps run on mutants
    mutates: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # the only endpoints a step may reach (``host[:port]``, port 443 by default), through
    # Choir's egress proxy; the network is otherwise off (``choir.sandbox.egress``). Absent
    # in the JSON when empty, so the config hash of every verifier without one is unchanged.
    hosts: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)

    @field_validator("hosts")
    @classmethod
    def _normal_hosts(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        return normalise_hosts(hosts)

    @model_validator(mode="after")
    def _trace_runs_choir(self) -> VerifierSpec:
        """A ``trace`` verifier runs Choir's trace verifier, nothing else: say so in config."""
        if self.kind is VerifierKind.TRACE and \
                [s.command for s in self.steps] != ["choir trace verify"]:
            raise ValueError("a trace verifier has exactly one step, "
                             "{name: verify, command: choir trace verify}; it checks the "
                             "run's own trace in-process")
        return self


# executor_gate: the llm executor's own check of its candidate (its spec is the default one;
# it never promotes anything, only the Director loop's rounds do)
# mutant: one run of a mutation check's steps on one mutant tree (choir.director.mutation)
Lens = Literal["default", "clean_rerun", "isolated_subset", "instrumented", "independent",
               "executor_gate", "mutant"]


class PlannedVerifier(Frozen):
    """A verifier in a plan, with the lens it runs under.

    ``tests`` narrows an isolated-subset run; ``checks`` names the verifier an independent
    checker stands beside. A ``diagnostic`` run is evidence for the feedback and is attested,
    but its result does not vote on the verdict (an instrumented run, a nested isolated run).
    """

    name: str
    lens: Lens = "default"
    replica: int = Field(default=0, ge=0)
    tests: tuple[str, ...] = ()
    checks: str | None = None
    diagnostic: bool = False


class VerifierPlan(Frozen):
    """What the Director chose for one round: always a subset of the allowlist."""

    schema_version: Literal[1] = 1
    mood: Mood
    verifiers: tuple[PlannedVerifier, ...]
    dropped: tuple[str, ...] = ()
    reason: str = ""
    suggested_by: Literal["policy", "model"] = "policy"
