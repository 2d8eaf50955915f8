"""Plain typed Python functions as JSON-schema tools.

The schema comes from the signature (pydantic validates the model's arguments before the
function runs) and the description from the docstring, including each ``Args:`` entry.
``agent_ctx`` / ``execution_ctx`` parameters are injected, never shown to the model.
Results are text for the model, bounded with an explicit marker: never cut silently.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from choir.agent.context import AgentContext, ExecutionContext
from choir.agent.injection import (
    Injected,
    call_maybe_async,
    inject,
    injected_params,
    type_hints,
)

MAX_RESULT_CHARS = 32_000
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ARGS = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The summary paragraph and the ``Args:`` descriptions of a Google-style docstring."""
    text = inspect.cleandoc(doc or "")
    summary = text.split("\n\n", 1)[0].strip()
    params: dict[str, str] = {}
    section, current = "", ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":") and stripped[:-1] in {"Args", "Arguments", "Parameters",
                                                         "Returns", "Raises", "Yields"}:
            section = stripped[:-1]
            continue
        if section in {"Args", "Arguments", "Parameters"} and stripped:
            match = _ARGS.match(line)
            if match and line.startswith(" " * 4) and not line.startswith(" " * 8):
                current = match.group(1)
                params[current] = match.group(2).strip()
            elif current:
                params[current] = f"{params[current]} {stripped}".strip()
    return summary, params


def clip(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """``text`` bounded to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[truncated: {len(text) - limit} more characters not shown]"


def render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, default=str, ensure_ascii=False)


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with its validated argument model."""

    name: str
    description: str
    fn: Callable[..., Any]
    args_model: type[BaseModel]
    injected: dict[str, Injected]

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry."""
        params = self.args_model.model_json_schema()
        params.pop("title", None)
        for prop in params.get("properties", {}).values():
            prop.pop("title", None)
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": params}}

    def validate(self, arguments: str | dict[str, Any]) -> BaseModel:
        """Parse the model's arguments. Raises ``ValueError`` / ``ValidationError``."""
        raw = model_json(arguments or "{}")
        if not isinstance(raw, dict):
            raise ValueError("tool arguments must be a JSON object")
        return validated(self.args_model, raw)

    async def call(self, args: BaseModel, agent_ctx: AgentContext,
                   execution_ctx: ExecutionContext) -> str:
        kwargs = {name: getattr(args, name) for name in type(args).model_fields}
        kwargs.update(inject(self.injected, agent_ctx, execution_ctx))
        return clip(render(await call_maybe_async(self.fn, **kwargs)))


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def model_json(arguments: Any) -> Any:
    """A model's arguments (a JSON text, or values a ``ModelClient`` parsed) as JSON values.

    The model's bytes are hostile (review 17d): NaN, Infinity and a float past the double
    range (``1e999``) are not JSON, and nesting past the recursion limit is no arguments;
    each raised where it was not caught (a candidate hashed, a context saved) and crashed
    the run instead of counting an invalid response.

    Raises:
        ValueError: the arguments are not JSON values.
    """
    try:
        raw = json.loads(arguments, parse_constant=_not_json) \
            if isinstance(arguments, str | bytes) else arguments
        json.dumps(raw, allow_nan=False)  # an inf from 1e999, a NaN a client parsed
    except RecursionError:
        raise ValueError("the arguments are nested too deeply") from None
    return raw


def validated(model: type[BaseModel], raw: Any) -> BaseModel:
    """``model`` validated from ``raw``; nesting pydantic cannot follow is a ValueError."""
    try:
        return model.model_validate(raw)
    except RecursionError:
        raise ValueError("the arguments are nested too deeply") from None


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         description: str | None = None) -> Any:
    """Make ``fn`` a Tool; usable bare (``@tool``) or with options (``@tool(name=...)``)."""
    def build(f: Callable[..., Any]) -> Tool:
        tool_name: str = name or str(getattr(f, "__name__", ""))
        if not _NAME.match(tool_name):
            raise ValueError(f"tool name {tool_name!r} must match {_NAME.pattern}")
        summary, arg_docs = parse_docstring(f.__doc__)
        hints = type_hints(f)
        injected = injected_params(f)
        fields: dict[str, Any] = {}
        for pname, param in inspect.signature(f).parameters.items():
            if pname in injected or pname == "self":
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {tool_name}: *args/**kwargs cannot become a schema")
            default = ... if param.default is param.empty else param.default
            fields[pname] = (hints.get(pname, Any),
                             Field(default, description=arg_docs.get(pname)))
        model = create_model(f"{tool_name}_args", __config__=ConfigDict(extra="forbid"),
                             **fields)
        return Tool(tool_name, str(description or summary or tool_name), f, model, injected)

    return build(fn) if fn is not None else build


def as_tools(items: Iterable[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """Tools by name; plain functions are converted. Duplicate names are refused."""
    out: dict[str, Tool] = {}
    for item in items:
        made = item if isinstance(item, Tool) else tool(item)
        if made.name in out or made.name == "final_output":
            raise ValueError(f"tool name {made.name!r} is used twice or reserved")
        out[made.name] = made
    return out
