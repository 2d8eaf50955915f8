"""The base every saved, hashed, signed or checkpointed model derives from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Immutable, strict about unknown fields, versioned by ``schema_version``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
