"""VERIFICATION_REPORT (docs/concepts.md): the only thing that leaves a green thread.

Every free-text field is bounded, so a report stays small whatever the log size, and
evidence is cited by pointer (artifact hash, line span, span hash), never pasted.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, field_validator, model_validator

from choir.models._base import Frozen

SUMMARY_MAX = 600
EXCERPT_MAX = 200
NEXT_ACTION_MAX = 200
HYPERTHESIS_MAX = 300
MAX_SIGNATURES = 8
MAX_FILES = 32
# a whole report's JSON, in bytes: what docs/concepts.md promises (choir.report.bound.fit)
REPORT_MAX_BYTES = 4096


class Result(StrEnum):
    """A verifier's verdict. Only PASS can ever promote."""

    PASS = "PASS"
    FAIL = "FAIL"
    FLAKY = "FLAKY"
    INCONCLUSIVE = "INCONCLUSIVE"


# A report's confidence before calibration lowers it (``choir.report.confidence``), and the
# only one a held-out report carries to the executor (``choir.evidence.heldout``).
CONFIDENCE = {Result.PASS: 0.9, Result.FAIL: 0.95, Result.INCONCLUSIVE: 0.2, Result.FLAKY: 0.4}


class Target(Frozen):
    """What was verified: the exact tree, so evidence cannot be reused for another."""

    work_item: str | None = None
    files: tuple[str, ...] = Field(default=(), max_length=MAX_FILES)
    commit_sha: str | None = None
    tree_hash: str
    # sha256 of the tree's canonical manifest (``choir.evidence.tree.tree_manifest``), for in-toto
    # consumers that match only sha256; left out of the JSON when absent, so evidence minted
    # before it existed keeps its hashes
    tree_sha256: str | None = Field(default=None, exclude_if=lambda v: v is None)


class Citation(Frozen):
    """A pointer into an artifact: lines ``line_start..line_end`` (1-based, inclusive)."""

    artifact: str
    line_start: int = Field(ge=1)
    line_end: int = Field(ge=1)
    span_hash: str

    @model_validator(mode="after")
    def _ordered(self) -> Citation:
        if self.line_end < self.line_start:
            raise ValueError("line_end must be >= line_start")
        return self


class FailureSignature(Frozen):
    """A canonicalised failure: the same failure in two runs has the same ``id``."""

    id: str
    kind: str = Field(max_length=64)
    test_id: str | None = Field(default=None, max_length=256)
    location: str | None = Field(default=None, max_length=256)
    excerpt: str = Field(default="", max_length=EXCERPT_MAX)
    citation: Citation | None = None


class Counts(Frozen):
    """Counts a parser could read; ``None`` means the parser could not tell."""

    run: int | None = None
    failed: int | None = None
    errors: int | None = None
    skipped: int | None = None


class VerifierHistory(Frozen):
    """What the AHDB has seen of one verifier, for calibrating a report's confidence: how
    many trees it judged, and on how many its evidence disagreed with itself (a PASS then a
    FAIL on the same tree: a demoted claim; a FAIL whose tree later passed: a refuted
    hypothesis)."""

    trees: int = Field(default=0, ge=0)
    reversals: int = Field(default=0, ge=0)


class Usage(Frozen):
    """Tokens and cost a model spent on this report."""

    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


class VerificationReport(Frozen):
    """The bounded, typed result of one verifier run."""

    schema_version: Literal[1] = 1
    verifier: str = Field(max_length=64)
    verifier_type: str = Field(max_length=64)
    target: Target
    result: Result
    failure_signatures: tuple[FailureSignature, ...] = Field(default=(), max_length=MAX_SIGNATURES)
    signatures_truncated: int = Field(default=0, ge=0)
    summary: str = Field(max_length=SUMMARY_MAX)
    next_actions: tuple[str, ...] = Field(min_length=1, max_length=3)
    confidence: float = Field(ge=0.0, le=1.0)
    hyperthesis: tuple[str, ...] = Field(default=(), max_length=4)
    counts: Counts = Field(default_factory=Counts)
    parser: str = Field(default="generic", max_length=32)
    parser_truncated: bool = False
    artifacts: dict[str, str] = Field(default_factory=dict, max_length=16)
    # bytes of step output not kept (``commands_executed[].output_cut``, summed): evidence, so
    # a reporter's wording cannot leave a cut log unsaid (review 23b); left out of the JSON
    # when 0, so reports of uncut logs keep the hashes they were stored and attested by
    log_cut_bytes: int = Field(default=0, ge=0, exclude_if=lambda v: v == 0)
    # the REPORTERS name that worded it ("model", a plugin's), "deterministic", or
    # "deterministic_fallback" when the chosen reporter failed or was refused
    reporter: str = Field(default="deterministic", max_length=64,
                          pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    usage: Usage = Field(default_factory=Usage)

    @field_validator("next_actions")
    @classmethod
    def _bounded_actions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for action in value:
            if len(action) > NEXT_ACTION_MAX:
                raise ValueError(f"a next action is longer than {NEXT_ACTION_MAX} characters")
        return value

    @field_validator("hyperthesis")
    @classmethod
    def _bounded_hyperthesis(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if len(item) > HYPERTHESIS_MAX:
                raise ValueError(f"a hyperthesis is longer than {HYPERTHESIS_MAX} characters")
        return value

    @model_validator(mode="after")
    def _bounded_whole(self) -> VerificationReport:
        size = len(self.model_dump_json(warnings=False).encode())
        if size > REPORT_MAX_BYTES:
            raise ValueError(f"the report is {size} bytes of JSON; the bound is "
                             f"{REPORT_MAX_BYTES} (choir.report.bound.fit makes it fit)")
        return self
