"""The tools' arguments: closed, frozen models, so a call can say only what they name.

``extra="forbid"`` is the point: a call that adds ``network``, ``allowlist``, ``sandbox``,
``command`` or ``home`` is refused with the field it named, never silently ignored (an agent
reading a success would believe the field took effect). Strings are bounded before anything
reads them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from choir.app.claim import NAME

PATH_MAX = 1024
NAME_PATTERN = NAME.pattern  # a claim
WORK_ITEM_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._~-]{0,127}$"  # WorkItem.id (~: a split's parts)
HASH_PATTERN = r"^[0-9a-f]{64}$"
RUNS_MAX = 50

MoodName = Literal["CALM", "SKEPTICAL", "PARANOID", "BOLD", "CURIOUS"]


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False)


RepoArg = Field(default=None, max_length=PATH_MAX,
                description="A repo this server was started for (its path, or a path that "
                            "resolves to it); default: the first one.")


class VerifyArgs(Args):
    """Verify a served repo's working tree now, under a mood of its policy."""

    repo: str | None = RepoArg
    mood: MoodName = Field(default="CALM", description="How strict: the repo's mood policy "
                                                       "decides which verifiers run.")
    claim: str | None = Field(default=None, pattern=NAME_PATTERN,
                              description="Record the verdict as this claim, so `gate` answers "
                                          "for the tree (ASSERTed only on PASS).")


class ShowArgs(Args):
    id: str = Field(pattern=HASH_PATTERN, description="An attestation id (64 hex), as `verify` "
                                                      "returns them.")


class GateArgs(Args):
    work_item: str = Field(pattern=WORK_ITEM_PATTERN,
                           description="A work item id or a claim name.")
    repo: str | None = RepoArg
    commit: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{7,64}$",
                               description="Only an ASSERT for exactly this commit.")


class ListRunsArgs(Args):
    repo: str | None = Field(default=None, max_length=PATH_MAX,
                             description="Only this served repo's `choir verify` sessions.")
    limit: int = Field(default=20, ge=1, le=RUNS_MAX, description="How many, newest first.")


__all__ = ["RUNS_MAX", "GateArgs", "ListRunsArgs", "ShowArgs", "VerifyArgs"]
