"""The one place litellm is imported.

litellm takes seconds to import and, unless told otherwise, fetches a price list from the
network at import time; both are handled here, lazily, on first use. Every call gets an
explicit timeout (litellm's default is 6000 s) and reports tokens and cost.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from choir.exceptions import ConfigError, MissingExtraError
from choir.models import Usage
from choir.telemetry import enabled, model_call, usage

if TYPE_CHECKING:
    from pydantic import BaseModel

    from choir.models import Usage

    Reply = TypeVar("Reply", bound=BaseModel)

_litellm: Any = None


# the provider coroutines litellm's ``completion`` hands its executor back
# (``OpenAIChatCompletion.acompletion``, ``BaseLLMHTTPHandler.async_completion``, ...); the
# same pattern is in pyproject.toml's filterwarnings, as pytest resets filters per test
UNAWAITED = r"coroutine '(\w+\.)?a(sync_)?\w*completion\w*' was never awaited"


def litellm_module() -> Any:
    """Import litellm once, configured for offline-safe use.

    Raises:
        MissingExtraError: litellm is not installed.
    """
    global _litellm
    if _litellm is None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("DISABLE_AIOHTTP_TRANSPORT", "True")
        try:
            import litellm
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError(
                "a model is configured but litellm is not installed: pip install 'choir[llm]'"
            ) from exc
        # a deadline that cancels ``acompletion`` while its synchronous half runs in an
        # executor thread leaves the provider's coroutine that thread returns unawaited (it
        # never started: no connection to close); Python's warning about it is noise
        warnings.filterwarnings("ignore", UNAWAITED, RuntimeWarning)
        litellm.disable_aiohttp_transport = True
        litellm.suppress_debug_info = True
        litellm.telemetry = False
        _warm(litellm)
        _litellm = litellm
    return _litellm


async def ready() -> None:
    """litellm imported and configured (``litellm_module``) in a worker thread, before any
    model call's deadline starts: its import takes seconds on a loaded machine (the modules
    it loads, then ``_warm``'s), and a reporter whose first call counted it ran out of its
    30 s on a CI machine running four suites (the call cancelled, the report worded by the
    fallback). The deadline is the model's time, not the interpreter's.

    Raises:
        MissingExtraError: litellm is not installed.
    """
    if _litellm is None:
        await asyncio.to_thread(litellm_module)


def _warm(litellm: Any) -> None:
    """One offline call (``mock_response``: no request leaves), so the modules litellm
    imports lazily on its first call (its proxy types, its callbacks; about 40, 1.4 s here
    and 15 times that on a loaded machine) are imported now, not inside the first real
    call's deadline: a reporter's first call on a loaded CI machine timed out on them."""
    try:
        litellm.completion(model="openai/choir-warm-up", api_key="-", mock_response="-",
                           messages=[{"role": "user", "content": "-"}])
    except Exception:  # noqa: BLE001 - a warm-up; the real call reports its own faults
        pass


@dataclass(frozen=True)
class Completion:
    """A model reply: the first choice's message, and what it cost."""

    message: Any
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


def _cost(litellm: Any, response: Any) -> float:
    try:
        return float(litellm.completion_cost(completion_response=response) or 0.0)
    except Exception:  # unknown model prices are common for local servers
        return 0.0


async def acomplete(
    *, model: str, messages: list[dict[str, Any]], timeout: float = 60.0, **kwargs: Any
) -> Completion:
    """One chat completion through litellm, with an explicit timeout and no hidden retries.

    Extra keyword arguments (``tools``, ``response_format``, ``api_base``, ``mock_response``,
    ...) go to ``litellm.acompletion`` unchanged. Errors propagate: callers decide what a
    fault means (the reporter falls back to deterministic reports; agents retry).
    """
    litellm = litellm_module()
    kwargs.setdefault("num_retries", 0)
    if kwargs.get("tools"):
        # With tools, litellm imports its MCP gateway, which needs the optional ``mcp``
        # package (ModuleNotFoundError otherwise). Choir never sends MCP tools.
        kwargs.setdefault("_skip_mcp_handler", True)
    with model_call(model, _provider(litellm, model, kwargs) if enabled() else "") as tel:
        response = await litellm.acompletion(
            model=model, messages=messages, timeout=timeout, **kwargs
        )
        spent = getattr(response, "usage", None)
        done = Completion(
            message=response.choices[0].message,
            model=model,
            prompt_tokens=int(getattr(spent, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(spent, "completion_tokens", 0) or 0),
            cost_usd=_cost(litellm, response),
        )
        tel.set(usage(done.prompt_tokens, done.completion_tokens, done.cost_usd))
    return done


def _provider(litellm: Any, model: str, kwargs: dict[str, Any]) -> str:
    """The provider litellm routes ``model`` to (``openai``, ``anthropic``, ...), for the
    model-call span; its prefix when litellm cannot tell."""
    try:
        return str(litellm.get_llm_provider(model, api_base=kwargs.get("api_base"))[1])
    except Exception:  # noqa: BLE001 - a name for a span, never a reason to fail the call
        return model.split("/", 1)[0] if "/" in model else "unknown"


# How a reply's JSON schema reaches the model's server (``CHOIR_MODEL_SCHEMA``): servers
# speak different dialects, and litellm knows only the hosted models it has a price list for.
SCHEMA_FORMS = {
    "auto": "the schema where litellm knows the model enforces one, else plain JSON mode",
    "json_schema": "OpenAI's structured outputs (llama.cpp's llama-server, vLLM, Ollama)",
    "json_object_schema": "JSON mode with the schema inside it (llama-cpp-python's server)",
    "json_object": "plain JSON mode, no schema",
}
SCHEMA_ENV = "CHOIR_MODEL_SCHEMA"


def schema_form() -> str:
    """The ``CHOIR_MODEL_SCHEMA`` setting; ``auto`` when unset.

    Raises:
        ConfigError: the variable holds anything else than a ``SCHEMA_FORMS`` name.
    """
    form = os.environ.get(SCHEMA_ENV, "").strip() or "auto"
    if form not in SCHEMA_FORMS:
        raise ConfigError(
            f"{SCHEMA_ENV}={form!r} is not a schema form", path=f"${SCHEMA_ENV}",
            hint="one of: " + "; ".join(f"{k} ({v})" for k, v in SCHEMA_FORMS.items()))
    return form


def _json_format(model: str, schema: type[BaseModel]) -> dict[str, Any]:
    """The reply's schema itself where the model's server constrains output to one (fewer
    invalid replies, so fewer retries), else plain JSON mode; the reply is validated
    against ``schema`` either way.

    llama-cpp-python's server turns ``{"type": "json_object", "schema": ...}`` into a
    grammar and refuses ``json_schema`` (HTTP 422), where llama.cpp's own server and OpenAI
    take ``json_schema``: the form is the deployment's to say (``CHOIR_MODEL_SCHEMA``).
    """
    form = schema_form()
    wire = _wire_schema(schema.model_json_schema())
    if form == "auto":
        try:
            known = bool(litellm_module().supports_response_schema(model=model))
        except Exception:  # noqa: BLE001 - an unknown model or provider: plain JSON mode
            known = False
        form = "json_schema" if known else "json_object"
    if form == "json_object":
        return {"type": "json_object"}
    if form == "json_object_schema":
        return {"type": "json_object", "schema": wire}
    return {"type": "json_schema", "json_schema": {
        "name": schema.__name__.strip("_") or "reply", "schema": wire, "strict": False}}


def _wire_schema(node: Any) -> Any:
    """``node`` without string length bounds: the reply is validated against the real
    schema here, and the output bound already caps its length.

    A server that compiles the schema into a grammar unrolls ``maxLength`` into that many
    nested rules: llama.cpp refuses the reporter's 4,000-character summary ("exceeds sane
    defaults"), and llama-cpp-python's server then crashed on the missing grammar (SIGSEGV:
    every later call of the run was refused).
    """
    if isinstance(node, list):
        return [_wire_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _SCHEMA_DATA:  # values, not schemas: kept as they are
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):  # names -> schemas
            out[key] = {name: _wire_schema(sub) for name, sub in value.items()}
        elif key != "maxLength":
            out[key] = _wire_schema(value)
    return out


_SCHEMA_DATA = ("default", "const", "enum", "examples")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_reply(content: str) -> Any:
    """A model's JSON reply, read as the model's grammar wrote it.

    Raw newlines and tabs inside strings are accepted (llama-cpp-python's grammar lets a
    model write them; strict JSON refuses them, and every reply of a small local model was
    lost to that); NaN and Infinity are not. The schema is checked by the caller, and
    every string is cleaned of control characters before it is shown.

    Raises:
        ValueError: the reply is not one JSON value.
    """
    return json.loads(content, strict=False, parse_constant=_no_constant)


def reply_tokens(reply_max: int) -> int:
    """The output-token bound for a reply of at most ``reply_max`` characters."""
    return reply_max // 4 + 64


async def ask_json(model: str, messages: list[dict[str, Any]], schema: type[Reply], *,
                   deadline_s: float, attempts: int = 3, reply_max: int = 8000,
                   **kwargs: Any) -> tuple[Reply | None, Usage, str]:
    """Ask for one JSON object of ``schema``; retry any fault with backoff inside a deadline.

    Returns the validated reply (or None when every try failed), what all tries spent, and
    the last fault in one line (empty on success). Never raises for model faults: each caller
    has a deterministic fallback.

    The model's output is bounded at the server (``max_tokens``, about a quarter of
    ``reply_max`` characters unless given): a small local model otherwise fills its whole
    context and a call outlives its deadline, where a reply over ``reply_max`` would be
    refused anyway.
    """
    try:
        await ready()  # off the event loop, before the clock starts (the format asks it too)
    except MissingExtraError as exc:
        return None, Usage(model=model), str(exc)
    kwargs.setdefault("max_tokens", reply_tokens(reply_max))
    kwargs.setdefault("response_format", _json_format(model, schema))

    from tenacity import AsyncRetrying, stop_after_attempt, stop_before_delay

    deadline = time.monotonic() + deadline_s
    spent = Usage(model=model)

    def left() -> float:
        return deadline - time.monotonic()

    if left() <= 0.5:
        return None, spent, "no time left for a model call"
    try:
        async for attempt in AsyncRetrying(
                # no try that would start with half a second or less of the deadline left
                stop=stop_after_attempt(attempts) | stop_before_delay(deadline_s - 0.5),
                wait=lambda state: min(0.2 * 2 ** (state.attempt_number - 1), max(0.0, left())),
                reraise=True):
            with attempt:
                # the deadline holds for the whole call: litellm's timeout bounds each read,
                # and a server that sends a byte a second kept a 3 s call for 20 (review 17)
                reply = await asyncio.wait_for(
                    acomplete(model=model, messages=messages, timeout=left(), **kwargs),
                    timeout=max(0.1, left()))
                spent = Usage(model=model,
                              prompt_tokens=spent.prompt_tokens + reply.prompt_tokens,
                              completion_tokens=spent.completion_tokens + reply.completion_tokens,
                              cost_usd=spent.cost_usd + reply.cost_usd)
                content = reply.message.content or ""
                if len(content) > reply_max:
                    raise ValueError(f"oversized reply ({len(content)} characters)")
                return schema.model_validate(parse_reply(content)), spent, ""
    except Exception as exc:  # noqa: BLE001 - every fault was retried; the caller falls back
        return None, spent, f"{type(exc).__name__}: {str(exc)[:200]}".replace("\n", " ")
    return None, spent, "no time left for a model call"  # pragma: no cover - stop raises
