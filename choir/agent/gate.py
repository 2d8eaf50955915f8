"""The verifier gate (docs/concepts.md): pass, reject (counted once per candidate), fatal, error.

A rejection counts one attempt unless it is the same candidate (canonical-JSON hash) as the
last one. The same candidate submitted again at the same model turn is a replay after a crash
and counts nothing; at a later turn it is a resubmission that makes no progress: after
``max_repeats`` identical rejections in a row the gate is exhausted (``no_progress``), long
before a turn bound would stop a model that never changes its answer. ``FatalAgentError``
ends the run.
Any other exception is a system error: retried within the policy, never an attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from choir._core.canonical import hash_json
from choir.agent.context import AgentContext, ExecutionContext, VerificationState
from choir.agent.feedback import one_line, rejection_feedback
from choir.agent.injection import call_maybe_async, inject, injected_params
from choir.exceptions import FatalAgentError, VerificationRejected

GateKind = Literal["passed", "rejected", "exhausted", "fatal", "system_error"]


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential back-off, for system errors (model, verifier)."""

    max_retries: int = 2
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def delay(self, retry: int) -> float:
        return float(min(self.max_backoff_s, self.backoff_s * (2 ** retry)))

    def retrying(self) -> AsyncRetrying:
        """tenacity's loop for this policy: system errors only (a rejection or a fatal error
        is an answer, not a fault), ``delay(n)`` between tries, the last error re-raised."""
        return AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=lambda state: self.delay(state.attempt_number - 1),
            retry=retry_if_exception(retryable), reraise=True)


def retryable(exc: BaseException) -> bool:
    """A system error worth another try: not an answer of the verifier (rejected, fatal),
    and not a client error (bad request, auth, not found), which will not change on retry.
    Never a cancellation or an interrupt: the executor's timeout cancels a verification in
    flight, and retried it ran the verifier again past the timeout (review 21d)."""
    if not isinstance(exc, Exception) or isinstance(exc, (VerificationRejected,
                                                           FatalAgentError)):
        return False
    status = getattr(exc, "status_code", None)
    return not (isinstance(status, int) and status in (400, 401, 403, 404, 422))


@dataclass(frozen=True)
class GateResult:
    kind: GateKind
    state: VerificationState
    output: Any = None
    feedback: str = ""
    error: str = ""
    no_progress: bool = False


def candidate_hash(candidate: Any) -> str:
    """The canonical-JSON blake3 hash of a validated candidate."""
    return hash_json(candidate)


@dataclass(frozen=True)
class Gate:
    """A verifier with its injection plan and attempt budget."""

    verifier: Callable[..., Any]
    max_attempts: int
    retry: RetryPolicy
    max_repeats: int = 3

    async def check(self, candidate: Any, agent_ctx: AgentContext,
                    execution_ctx: ExecutionContext) -> GateResult:
        state = agent_ctx.verification
        digest = candidate_hash(candidate)
        kwargs = inject(injected_params(self.verifier), agent_ctx, execution_ctx)
        try:
            async for attempt in self.retry.retrying():
                with attempt:
                    value = await call_maybe_async(self.verifier, candidate, **kwargs)
        except VerificationRejected as rejected:
            if rejected.candidate is not None:  # the same words over another tree: another
                digest = hash_json([digest, rejected.candidate])  # candidate (review 17d)
            new = self._count(state, digest, agent_ctx.turn)
            feedback = rejection_feedback(rejected.message, rejected.code,
                                          rejected.metadata, attempts_used=new.attempts_used,
                                          max_attempts=self.max_attempts,
                                          repeats=new.repeats, max_repeats=self.max_repeats)
            stuck = new.repeats >= self.max_repeats
            kind: GateKind = ("exhausted" if stuck or new.attempts_used >= self.max_attempts
                              else "rejected")
            return GateResult(kind, new, feedback=feedback, no_progress=stuck,
                              error=one_line(rejected.message))
        except FatalAgentError as fatal:
            return GateResult("fatal", state, error=one_line(str(fatal)))
        except Exception as exc:  # noqa: BLE001 - a system error, never an attempt
            failed = state.model_copy(update={"last_outcome": "system_error"})
            return GateResult("system_error", failed,
                              error=one_line(f"{type(exc).__name__}: {exc}"))
        passed = state.model_copy(update={"last_candidate_hash": digest, "repeats": 0,
                                          "last_outcome": "passed",
                                          "checked_turn": agent_ctx.turn})
        return GateResult("passed", passed, output=value)

    @staticmethod
    def _count(state: VerificationState, digest: str, turn: int) -> VerificationState:
        """The accounting after a rejection of ``digest`` submitted at model turn ``turn``."""
        same = digest == state.last_candidate_hash and state.last_outcome == "rejected"
        if same and state.checked_turn in (None, turn):  # a replay: already counted
            return state.model_copy(update={"checked_turn": turn,
                                            "repeats": max(state.repeats, 1)})
        if same:  # resubmitted unchanged: no new attempt, one more repeat
            return state.model_copy(update={"repeats": state.repeats + 1,
                                            "checked_turn": turn})
        return state.model_copy(update={"attempts_used": state.attempts_used + 1,
                                        "last_candidate_hash": digest, "repeats": 1,
                                        "last_outcome": "rejected", "checked_turn": turn})
