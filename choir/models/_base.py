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


def build_deferred() -> int:
    """Build now the validator of every imported model that has not been used yet, and
    return how many were built: for ``choir serve``, which imports what a request runs and
    then forks a worker per request, so that no request builds one on its path."""
    built, todo = 0, list(Frozen.__subclasses__())
    while todo:
        model = todo.pop()
        todo.extend(model.__subclasses__())
        if not model.__pydantic_complete__:
            model.model_rebuild(force=True)
            built += 1
    return built
