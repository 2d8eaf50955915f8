"""A model call as the OpenTelemetry GenAI semantic conventions name it.

The span is ``chat {model}``, a client span, with the operation, the provider (under both the
current ``gen_ai.provider.name`` and the older ``gen_ai.system``), the model asked, the
tokens both ways and Choir's cost. Messages and replies are never attributes: the span says
that a call happened and what it spent, not what was said.
"""

from __future__ import annotations

from typing import Any

from choir.telemetry.spans import span


def model_call(model: str, provider: str) -> Any:
    """The span around one chat completion; ``set`` the usage on it (``usage``)."""
    return span(f"chat {model}", {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
        "gen_ai.system": provider, "gen_ai.request.model": model}, kind="client")


def usage(input_tokens: int, output_tokens: int, cost_usd: float) -> dict[str, Any]:
    """The attributes that say what a finished call spent."""
    return {"gen_ai.usage.input_tokens": input_tokens,
            "gen_ai.usage.output_tokens": output_tokens, "choir.cost_usd": cost_usd}
