"""AHDB atoms (docs/concepts.md): ASSERT, HYPOTHESIZE and HYPERTHESIS claims with their status."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import Field

from choir.models._base import Frozen


class AtomKind(StrEnum):
    ASSERT = "ASSERT"
    HYPOTHESIZE = "HYPOTHESIZE"
    HYPERTHESIS = "HYPERTHESIS"


class AtomStatus(StrEnum):
    PROPOSED = "PROPOSED"
    PROMOTED = "PROMOTED"
    DEMOTED = "DEMOTED"


class Atom(Frozen):
    """One claim. ``references`` are atom ids; ``attestations`` are attestation ids."""

    schema_version: Literal[1] = 1
    id: str
    kind: AtomKind
    status: AtomStatus
    work_item: str | None = None
    tree_hash: str | None = None
    commit_sha: str | None = None
    claim: str = Field(max_length=1000)
    discriminating_test: str | None = Field(default=None, max_length=600)
    references: tuple[str, ...] = ()
    attestations: tuple[str, ...] = ()
    required_verifiers: tuple[str, ...] = ()
    created_at: datetime
    updated_at: datetime
