"""Dependency injection for tools and verifiers: ``agent_ctx`` and ``execution_ctx``.

A parameter receives the AgentContext when it is named ``agent_ctx`` or annotated with
``AgentContext``, and the ExecutionContext likewise. Everything else is the caller's (the
model's arguments for a tool, the validated output for a verifier).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from functools import partial
from typing import Any, Literal

from choir.agent.context import AgentContext, ExecutionContext

Injected = Literal["agent_ctx", "execution_ctx"]

_THREADS: contextvars.ContextVar[Executor | None] = contextvars.ContextVar(
    "choir_tool_threads", default=None)


@contextmanager
def tool_threads(pool: Executor) -> Iterator[None]:
    """Run the sync callables called within (and in tasks started within) on ``pool``.

    ``asyncio.run`` waits for the threads of the loop's default executor before it returns,
    so a tool still running when its caller timed out held the caller past its timeout
    (review 21d: 92.5 s for 40 s). A pool of the caller's own can be left behind with
    ``pool.shutdown(wait=False, cancel_futures=True)``.
    """
    token = _THREADS.set(pool)
    try:
        yield
    finally:
        _THREADS.reset(token)


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
    """Await an async callable; run a sync one in a worker thread so the loop stays free
    (on the ``tool_threads`` pool when one is set, as ``asyncio.to_thread`` otherwise)."""
    if inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)):
        return await fn(*args, **kwargs)
    call = partial(contextvars.copy_context().run, fn, *args, **kwargs)
    result = await asyncio.get_running_loop().run_in_executor(_THREADS.get(), call)
    if inspect.isawaitable(result):
        return await result
    return result
