"""The base every saved, hashed, signed or checkpointed model derives from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Immutable, strict about unknown fields, versioned by ``schema_version``."""

    # finite numbers only: an infinite timeout or limit passed validation and crashed the
    # run after its work, when the canonical JSON of what is signed refused it (review 16c)
    # defer_build: a model's validator is built at its first use, not at import (a cold
    # command imports 70 models and uses a few: 70-80 ms of each cold `choir verify` here)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False,
                              defer_build=True)
