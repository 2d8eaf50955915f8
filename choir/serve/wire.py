"""What a client may ask the service: closed, frozen, bounded models, never code.

A request names a command (``verify`` or ``run``) and exactly the options its command line
takes, nothing else: ``extra="forbid"`` refuses a ``network``, ``allowlist``, ``policy`` or
``home`` field by name, so no request can do what the same user's command line could not.
Values are bounded before anything reads them; their meaning is checked by the same code the
cold path runs (a bad claim name or mood policy is the same exit-2 error either way).

The context says where the request comes from, so the worker can stand where a cold process
would: the client's version and code digest (``choir.serve.stale``), its environment
(applied whole to the worker, which never sees the service's own), its umask and its
working directory. The directory travels twice: as a path, and as a descriptor (with one of
the client's root) passed over the socket; the worker uses the descriptor and refuses a path
that names another folder, so a client cannot make the service stand somewhere it is not.

Frames from the service to the client are JSON objects with one key:
``queued`` (every worker is busy), ``stale`` or ``refused`` (the client runs cold),
``started`` (a worker took the request), ``event`` (a progress event for the client's live
view), ``done`` (the command's answer), ``error`` (``message`` and exit ``code``).
From the client after the request: ``{"op": "stop"}`` (stop the sandboxes, answer anyway).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from choir.models import Mood

PATH_MAX = 4096
NAME_MAX = 1024
ENV_MAX = 4096  # variables
ENV_VALUE_MAX = 128 << 10
MAX_REQUEST = 1 << 20  # bytes of one request frame, environment included

Text = Annotated[str, StringConstraints(max_length=NAME_MAX, pattern=r"^[^\x00]*$")]
PathText = Annotated[str, StringConstraints(min_length=1, max_length=PATH_MAX,
                                            pattern=r"^[^\x00]*$")]


class _Closed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class VerifyRequest(_Closed):
    """``choir verify [--repo DIR] [--mood MOOD] [--sandbox NAME] [--json] [--claim NAME]
    [--otel]``."""

    command: Literal["verify"]
    repo: PathText = "."
    mood: Mood | None = None
    sandbox: Text | None = None
    as_json: bool = False
    claim: Text | None = None
    otel: bool = False


class RunRequest(_Closed):
    """``choir run [WORKITEM] [--mood MOOD] [--run-id ID] [--resume ID] [--json] [--otel]``."""

    command: Literal["run"]
    workitem: PathText | None = None
    mood: Mood | None = None
    run_id: Text | None = None
    resume: Text | None = None
    as_json: bool = False
    otel: bool = False


Request = VerifyRequest | RunRequest


class Context(_Closed):
    """Where the request comes from (see the module docstring)."""

    version: Annotated[str, StringConstraints(max_length=64)]
    code: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    cwd: PathText
    umask: int = Field(ge=0, le=0o777)
    environ: dict[Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX,
                                                   pattern=r"^[^=\x00]+$")],
                  Annotated[str, StringConstraints(max_length=ENV_VALUE_MAX,
                                                   pattern=r"^[^\x00]*$")]]

    @field_validator("environ")
    @classmethod
    def _bounded(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > ENV_MAX:
            raise ValueError(f"at most {ENV_MAX} variables")
        return value


class Envelope(_Closed):
    """One request frame."""

    context: Context
    request: Request = Field(discriminator="command")


__all__ = ["MAX_REQUEST", "Context", "Envelope", "Request", "RunRequest", "VerifyRequest"]
