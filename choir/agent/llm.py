"""How an agent talks to a model: one small protocol, and litellm behind it.

``Agent(model="openai/gpt-4o-mini")`` uses ``LiteLLMModel``; anything with an async
``complete(messages, tools)`` works too (``choir.testing.FakeModel`` does, offline).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from choir.llm import acomplete
from choir.models import Usage


@dataclass(frozen=True)
class ToolCall:
    """One tool call as the model made it; ``arguments`` is the raw JSON text."""

    id: str
    name: str
    arguments: str

    def as_message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ModelReply:
    """The first choice of a chat completion, and its spend."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)

    def as_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [c.as_message() for c in self.tool_calls]
        return message


@runtime_checkable
class ModelClient(Protocol):
    """What the agent loop needs from a model."""

    name: str

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]]) -> ModelReply:
        """One completion.

        Raises:
            Exception: any transport or provider error; the agent retries within its policy.
        """
        ...


def _calls(message: Any) -> tuple[ToolCall, ...]:
    out = []
    for i, call in enumerate(getattr(message, "tool_calls", None) or ()):
        fn = getattr(call, "function", None)
        out.append(ToolCall(id=str(getattr(call, "id", None) or f"call_{i}"),
                            name=str(getattr(fn, "name", "") or ""),
                            arguments=str(getattr(fn, "arguments", "") or "")))
    return tuple(out)


@dataclass
class LiteLLMModel:
    """Any litellm model name; ``settings`` go to ``litellm.acompletion`` (``api_base``...)."""

    name: str
    timeout_s: float = 120.0
    settings: dict[str, Any] = field(default_factory=dict)
    # every reply is bounded at the server (``settings`` may say otherwise): a turn that
    # writes more than this is cut, and the agent's loop sees a truncated reply, not a hang
    max_tokens: int = 4096

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]]) -> ModelReply:

        extra: dict[str, Any] = {"max_tokens": self.max_tokens, **self.settings}
        if tools:
            extra.setdefault("tools", tools)
        done = await acomplete(model=self.name, messages=messages, timeout=self.timeout_s,
                               **extra)
        usage = Usage(model=self.name, prompt_tokens=done.prompt_tokens,
                      completion_tokens=done.completion_tokens, cost_usd=done.cost_usd)
        return ModelReply(content=getattr(done.message, "content", None),
                          tool_calls=_calls(done.message), usage=usage)


def as_model(model: str | ModelClient, settings: dict[str, Any] | None = None) -> ModelClient:
    if isinstance(model, str):
        return LiteLLMModel(name=model, settings=dict(settings or {}))
    return model


def add_usage(total: Usage, more: Usage) -> Usage:
    """Spend summed; the model name kept when there is only one."""
    model = total.model if total.model in (None, more.model) else "mixed"
    return Usage(model=model or more.model,
                 prompt_tokens=total.prompt_tokens + more.prompt_tokens,
                 completion_tokens=total.completion_tokens + more.completion_tokens,
                 cost_usd=round(total.cost_usd + more.cost_usd, 8))
