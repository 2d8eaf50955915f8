"""Choir: agentic work that proves what it did.

Importing ``choir`` is light: the public names below load on first access, and litellm,
langgraph and docker are imported only where they are used.
"""

from __future__ import annotations

import importlib

from choir._version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (2-8 ms on the warm
# path of `choir verify`); mypy reads any TYPE_CHECKING as true
if TYPE_CHECKING:
    from typing import Any

    from choir.agent import Agent, AgentContext, ExecutionContext
    from choir.models import Mood, WorkItem

_LAZY: dict[str, str] = {
    "Agent": "choir.agent",
    "AgentContext": "choir.agent",
    "ExecutionContext": "choir.agent",
    "Mood": "choir.models",
    "WorkItem": "choir.models",
}

__all__ = [
    "Agent",
    "AgentContext",
    "ExecutionContext",
    "Mood",
    "WorkItem",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'choir' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
