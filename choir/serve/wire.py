"""What a client may ask the service: closed, frozen, bounded models, never code.

A request is a ``choir verify`` or ``choir run`` command line as the user typed it (after
``choir``), and nothing else: the worker parses it with the same click command the cold
path parses it with, so a request can ask for nothing the same user's command line could
not (an option the command does not have is the same usage error, exit 2, either way), and
``extra="forbid"`` refuses any field beside it by name (a ``network``, ``allowlist``,
``policy`` or ``home``). Values are bounded before anything reads them.

The context says where the request comes from, so the worker can stand where a cold process
would: the client's version and code digest (``choir.serve.stale``), its process standing
(capabilities, ``no_new_privs``, seccomp, LSM label, groups: the worker answers
``stale`` unless they are the service's), its environment (applied whole to the worker,
which never sees the service's own), its resource limits, its umask and its working
directory (a client older than the standing and the limits sends neither: it is stale).
The directory travels twice: as a path, and as a descriptor (with one of the client's root)
passed over the socket; the worker uses the descriptor and refuses a path that names another
folder, so a client cannot make the service stand somewhere it is not.

Frames from the service to the client are JSON objects with one key: ``queued`` (every
worker is busy), ``stale`` or ``refused`` (the client runs cold), ``ready`` (a worker took
the request: the client's stdin, stdout and stderr follow), ``started`` (the command runs,
printing on those), ``exit`` (its exit code). From the client after the request:
``{"op": "stop"}`` (stop the sandboxes, answer anyway).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from choir.serve import SERVED
from choir.serve.stale import RLIMITS

PATH_MAX = 4096
NAME_MAX = 1024
ENV_MAX = 4096  # variables
ENV_VALUE_MAX = 128 << 10
MAX_REQUEST = 1 << 20  # bytes of one request frame, environment included
ARGV_MAX = 256  # words of one command line
STANDING_MAX = 16  # parts of a process standing (``choir.serve.stale.standing``)
STANDING_VALUE_MAX = 16 << 10  # a status line, a label or a group list is well under this
RLIM_MAX = (1 << 63) - 1

PathText = Annotated[str, StringConstraints(min_length=1, max_length=PATH_MAX,
                                            pattern=r"^[^\x00]*$")]
Word = Annotated[str, StringConstraints(max_length=PATH_MAX, pattern=r"^[^\x00]*$")]


class _Closed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Request(_Closed):
    """``choir verify [OPTIONS]`` or ``choir run [WORKITEM] [OPTIONS]``: ``argv`` is the
    command line after ``choir``, its first word the command."""

    argv: tuple[Word, ...] = Field(min_length=1, max_length=ARGV_MAX)

    @field_validator("argv")
    @classmethod
    def _served(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if value[0] not in SERVED:
            raise ValueError(f"the service runs {' and '.join(SERVED)}, not {value[0][:64]!r}")
        return value

    @property
    def command(self) -> str:
        return self.argv[0]


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
    standing: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z]{1,32}$")],
                   Annotated[str, StringConstraints(max_length=STANDING_VALUE_MAX,
                                                    pattern=r"^[^\x00]*$")]] | None = None
    rlimits: dict[str, tuple[Annotated[int, Field(ge=-1, le=RLIM_MAX)],
                             Annotated[int, Field(ge=-1, le=RLIM_MAX)]]] | None = None

    @field_validator("environ")
    @classmethod
    def _bounded(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > ENV_MAX:
            raise ValueError(f"at most {ENV_MAX} variables")
        return value

    @field_validator("standing")
    @classmethod
    def _few(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and len(value) > STANDING_MAX:
            raise ValueError(f"at most {STANDING_MAX} parts")
        return value

    @field_validator("rlimits")
    @classmethod
    def _known(cls, value: dict[str, tuple[int, int]] | None
               ) -> dict[str, tuple[int, int]] | None:
        unknown = set(value or ()) - set(RLIMITS)
        if unknown:
            raise ValueError(f"not a resource limit: {sorted(unknown)[0][:32]!r}")
        return value


class Envelope(_Closed):
    """One request frame."""

    context: Context
    request: Request


__all__ = ["MAX_REQUEST", "Context", "Envelope", "Request"]
