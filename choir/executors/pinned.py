"""What the ``llm`` executor's own gate verifies with: the run's pinned configuration and mood.

The agent edits the repo it is verified in, ``choir.yaml`` included, so its gate must not
read the configuration back from the working tree; and the Director's mood of the moment,
not the work item's starting mood, decides the plan. The orchestrator's execute node sets
this around the executor call (``asyncio.to_thread`` carries context variables across).
Kept free of heavy imports so the orchestrator can import it without the agent stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from choir.config import RepoConfig
    from choir.config.policy import Policy
    from choir.models import Mood


@dataclass(frozen=True)
class GateContext:
    """``read_only``: the run's pinned spec paths, bound read-only over the executor's
    writable repo (``choir.evidence.spec.executor_read_only``)."""

    config: RepoConfig
    policy: Policy
    mood: Mood
    read_only: tuple[Path, ...] = ()


_GATE: ContextVar[GateContext | None] = ContextVar("choir_llm_gate", default=None)


@contextmanager
def pinned_gate(config: RepoConfig, policy: Policy, mood: Mood,
                read_only: tuple[Path, ...] = ()) -> Iterator[None]:
    token = _GATE.set(GateContext(config, policy, mood, read_only))
    try:
        yield
    finally:
        _GATE.reset(token)


def current_gate() -> GateContext | None:
    return _GATE.get()
