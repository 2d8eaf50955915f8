"""Dependency injection for tools and verifiers: ``agent_ctx`` and ``execution_ctx``.

A parameter receives the AgentContext when it is named ``agent_ctx`` or annotated with
``AgentContext``, and the ExecutionContext likewise. Everything else is the caller's (the
model's arguments for a tool, the validated output for a verifier).
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Callable
from typing import Any, Literal

from choir.agent.context import AgentContext, ExecutionContext

Injected = Literal["agent_ctx", "execution_ctx"]


def type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Resolved annotations (postponed ones included); empty when they cannot be resolved."""
    target: Any = fn if inspect.isroutine(fn) else type(fn).__call__
    try:
        return typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - unresolvable hints: fall back to names only
        return {}


def injected_params(fn: Callable[..., Any]) -> dict[str, Injected]:
    """Which parameters of ``fn`` Choir fills in, by name or by annotation."""
    hints = type_hints(fn)
    out: dict[str, Injected] = {}
    for name in inspect.signature(fn).parameters:
        hint = hints.get(name)
        if name == "agent_ctx" or hint is AgentContext:
            out[name] = "agent_ctx"
        elif name == "execution_ctx" or hint is ExecutionContext:
            out[name] = "execution_ctx"
    return out


def inject(params: dict[str, Injected], agent_ctx: AgentContext,
           execution_ctx: ExecutionContext) -> dict[str, Any]:
    values = {"agent_ctx": agent_ctx, "execution_ctx": execution_ctx}
    return {name: values[kind] for name, kind in params.items()}


async def call_maybe_async(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await an async callable; run a sync one in a worker thread so the loop stays free."""
    if inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result
