"""Every error Choir raises, in one place (public as ``choir.exceptions``).

Usage and configuration mistakes are kept apart from run-time failures: the CLI turns a
``UserError`` into exit code 2 with the file and line it names, and everything else into a
result (FAIL / INCONCLUSIVE) or exit 1. Constructors only store what they are given.

    ChoirError
    ├── UserError                      usage or configuration mistake: exit 2
    │   ├── ConfigError                a file the user wrote is wrong (file, line, fix)
    │   ├── UnknownNameError           a registry has no such name (sandbox, parser, ...)
    │   └── MissingExtraError          an optional dependency is not installed
    ├── IntegrityError                 stored evidence does not match its hash or signature
    ├── NotFoundError                  a stored object (attestation, ...) is absent; a LookupError
    ├── PromotionError                 an AHDB write that the promotion rules forbid
    ├── SandboxError                   the sandbox could not start or run: INCONCLUSIVE
    │   └── ModelUnavailableError      an executor's model did not answer: no attempt spent
    ├── ReporterError                  the cheap model failed; the deterministic report is used
    └── AgentError                     agent run-time failures
        ├── VerificationRejected       the verifier rejected a candidate: counts an attempt
        ├── FatalAgentError            fail the run at once
        └── InvalidModelResponse       the model's reply could not be used: not an attempt
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (2-8 ms on the warm
# path of `choir verify`); mypy reads any TYPE_CHECKING as true
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "AgentError",
    "ChoirError",
    "ConfigError",
    "ConfigErrors",
    "FatalAgentError",
    "IntegrityError",
    "InvalidModelResponse",
    "MissingExtraError",
    "ModelUnavailableError",
    "NotFoundError",
    "PromotionError",
    "ReporterError",
    "SandboxError",
    "SigningRefused",
    "ToolInputError",
    "UnknownNameError",
    "UserError",
    "VerificationRejected",
]


class ChoirError(Exception):
    """Root of every error Choir raises on purpose."""


class UserError(ChoirError):
    """A usage or configuration mistake. The CLI exits with code 2."""


class ConfigError(UserError):
    """A file the user wrote is wrong.

    Args:
        message: what is wrong.
        path: the file.
        line: 1-based line number, when known.
        hint: what to write instead.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.path = path
        self.line = line
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        from choir._core.terminal import strip_controls  # its `re` stays off the warm client

        where = ""
        if self.path:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        text = f"{where}{self.message}"
        if self.hint:
            text += f"\n  fix: {self.hint}"

        return strip_controls(text)

    @property
    def errors(self) -> tuple[ConfigError, ...]:
        """The individual errors (this one alone, unless it aggregates several)."""
        return (self,)

    @staticmethod
    def raise_all(errors: list[ConfigError]) -> None:
        """Raise nothing, the one error, or all of them together (sorted by line)."""
        flat = [e for err in errors for e in err.errors]
        flat.sort(key=lambda e: (e.path or "", e.line or 0))
        if len(flat) == 1:
            raise flat[0]
        if flat:
            raise ConfigErrors(flat)


class ConfigErrors(ConfigError):
    """Every mistake found in one file, reported together so the user fixes them in one pass.

    Args:
        errors: the individual errors, in file order; each names its line and a fix.
    """

    def __init__(self, errors: list[ConfigError]) -> None:
        self._errors = tuple(errors)
        first = self._errors[0]
        super().__init__(first.message, path=first.path, line=first.line, hint=first.hint)

    @property
    def errors(self) -> tuple[ConfigError, ...]:
        return self._errors

    def __str__(self) -> str:
        items = getattr(self, "_errors", ())
        if not items:
            return super().__str__()
        return f"{len(items)} errors:\n" + "\n".join(str(e) for e in items)


class UnknownNameError(UserError):
    """A registry lookup failed; the message lists the names that exist."""


class MissingExtraError(UserError):
    """An optional dependency is missing; the message gives the exact install command."""


class IntegrityError(ChoirError):
    """Stored evidence does not match its hash, signature or chain."""


class SigningRefused(IntegrityError):
    """The signing broker refused a request: the bytes are not a Choir object it signs."""


class NotFoundError(ChoirError, LookupError):
    """A stored object that was asked for by id does not exist (absent, not corrupt)."""


class PromotionError(ChoirError):
    """An AHDB write the promotion rules forbid (for example an ASSERT without attestations)."""


class SandboxError(ChoirError):
    """The sandbox itself failed (could not start, engine gone): INCONCLUSIVE, never FAIL."""


class ModelUnavailableError(SandboxError):
    """An executor's model did not answer (a server down or overloaded, a timeout, after
    the agent's own bounded retries): infrastructure, like a sandbox that could not start.
    No attempt of the work item's budget is spent on it; ``choir run --resume`` asks again
    from the last turn."""


class ReporterError(ChoirError):
    """The cheap-model reporter failed; callers fall back to the deterministic report."""


class AgentError(ChoirError):
    """Base of agent run-time errors."""


class VerificationRejected(AgentError):
    """Raised by a verifier to reject a candidate. Counts one verification attempt.

    Args:
        message: short human-readable reason, shown to the model.
        code: a machine-readable code, e.g. ``"tests_failed"``.
        metadata: small structured details; bounded and sanitised before use.
        candidate: what was verified when the output alone does not say it (the tree an
            executor's summary stands for): two rejections are of the same candidate, a
            resubmission that counts no attempt, only when this is the same too.
    """

    def __init__(
        self, message: str, code: str | None = None, metadata: dict[str, Any] | None = None,
        candidate: str | None = None,
    ) -> None:
        self.message = message
        self.code = code
        self.metadata = metadata
        self.candidate = candidate
        super().__init__(message)


class FatalAgentError(AgentError):
    """Raised by a verifier or tool to fail the run at once, whatever budget remains."""


class InvalidModelResponse(AgentError):
    """The model's reply could not be used (bad tool arguments, schema violation)."""


class ToolInputError(AgentError):
    """A tool refused its input; the model is told why and may try again."""
