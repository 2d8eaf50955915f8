"""The state an agent run carries: AgentContext (persisted) and ExecutionContext (runtime).

``AgentContext`` is the source of truth for a run: the conversation, the turn counter, the
model spend and the ``VerificationState``. It is a frozen model, replaced (never
mutated) after each step, so a saved context is exactly what the next step starts from.
``ExecutionContext`` is per-process and is never persisted: counters never live there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from choir._core.terminal import utf8
from choir.models import Usage
from choir.models._base import Frozen

Outcome = Literal["passed", "rejected", "system_error"]


class VerificationState(Frozen):
    """Attempt accounting for the verifier gate.

    ``last_candidate_hash`` is the canonical-JSON hash of the last verified candidate: a
    rejection of the same candidate again does not spend a second attempt. ``repeats``
    counts how many times in a row that identical candidate was rejected, and
    ``checked_turn`` the model turn that submitted it last: the same candidate again at the
    same turn is a replay after a crash (counted nothing), at a later turn a resubmission
    (one more repeat; too many end the run with no progress).

    ``unresolved`` maps each tool whose postcondition failed (or was inconclusive) to the
    model turn of that failure, until a later call of the same tool passes every required
    postcondition. While it is not empty no ``final_output`` is considered: a run completes
    only after its actions' effects checked out (docs/postconditions.md).
    """

    attempts_used: int = Field(default=0, ge=0)
    last_candidate_hash: str | None = None
    last_outcome: Outcome | None = None
    repeats: int = Field(default=0, ge=0)
    checked_turn: int | None = None
    unresolved: dict[str, int] = Field(default_factory=dict)


class AgentContext(Frozen):
    """Everything a run needs to continue after a crash, and nothing process-specific.

    ``messages`` are OpenAI-format chat messages (plain JSON), so any saved context can be
    inspected and resumed by a fresh process.
    """

    schema_version: Literal[1] = 1
    query: str
    messages: tuple[dict[str, Any], ...] = ()
    turn: int = Field(default=0, ge=0)
    output: Any = None
    attempt: int = Field(default=0, ge=0)
    invalid_responses: int = Field(default=0, ge=0)
    verification: VerificationState = Field(default_factory=VerificationState)
    usage: Usage = Field(default_factory=Usage)
    status: Literal["running", "completed", "failed"] = "running"
    error: str | None = None

    def with_messages(self, *new: dict[str, Any], **changes: Any) -> AgentContext:
        """A copy with ``new`` messages appended and ``changes`` applied.

        Every string of a message made valid UTF-8 (``utf8``): a tool's answer naming a file
        whose name is not UTF-8, or a model's reply with a lone surrogate, could not be saved
        to a store, and crashed the run at that save, and again on every resume (review 17d)."""
        return self.model_copy(update={"messages": (*self.messages, *map(_utf8, new)),
                                       **changes})

    def pending_tool_calls(self) -> list[dict[str, Any]]:
        """Tool calls of the last assistant message that have no answer yet (after a crash)."""
        if not self.messages:
            return []
        answered = set()
        for message in reversed(self.messages):
            if message.get("role") == "tool":
                answered.add(message.get("tool_call_id"))
                continue
            if message.get("role") == "assistant":
                return [c for c in message.get("tool_calls") or ()
                        if c.get("id") not in answered]
            return []
        return []


@dataclass
class ExecutionContext:
    """Per-process run-time values handed to tools and verifiers; never persisted.

    Attributes:
        run_id: the run's id (the persistence key when a store is used).
        deps: anything the caller passed to ``Agent.run(..., deps=...)``.
        emit: records an event for the run (name, data).
    """

    run_id: str
    deps: Any = None
    emit: Callable[[str, dict[str, Any]], None] = field(default=lambda name, data: None)


def _utf8(value: Any) -> Any:
    """``value`` (a message, its nested lists and dicts) with every string valid UTF-8."""
    if isinstance(value, str):
        return utf8(value)
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_utf8(v) for v in value)
    return value
