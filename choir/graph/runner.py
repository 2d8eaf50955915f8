"""Durable runs: the orchestrator over an AsyncSqliteSaver under ``CHOIR_HOME``.

Every node's result is checkpointed, so after a crash ``resume(run_id)`` continues from the
last finished node; ``approve`` answers a human-approval interrupt and finishes the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from choir._paths import choir_home
from choir.models import Mood

OnEvent = Callable[[str, dict[str, Any]], None]


@dataclass
class RunOutcome:
    run_id: str
    status: str
    reason: str = ""
    attempt: int = 0
    mood: str = ""
    asserted: str = ""
    events: list[str] = field(default_factory=list)
    waiting: bool = False

    def exit_code(self) -> int:
        return {"asserted": 0, "awaiting_approval": 3}.get(self.status, 1)


async def _drive(graph_input: Any, run_id: str, on_event: OnEvent | None) -> RunOutcome:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from choir.graph.orchestrator import build
    from choir.graph.state import checkpoint_types

    home = choir_home()
    home.mkdir(parents=True, exist_ok=True)
    async with AsyncSqliteSaver.from_conn_string(str(home / "checkpoints.sqlite")) as saver:
        saver.serde = JsonPlusSerializer(allowed_msgpack_modules=checkpoint_types())
        graph = build().compile(checkpointer=saver)
        cfg: Any = {"configurable": {"thread_id": run_id}, "recursion_limit": 10_000}
        async for part in graph.astream(graph_input, cfg, stream_mode="updates"):
            for node, update in part.items():
                if on_event is not None and isinstance(update, dict):
                    on_event(node, update)
        snap = await graph.aget_state(cfg)
    values = snap.values or {}
    return RunOutcome(run_id=run_id, status=values.get("status", "unknown"),
                      reason=values.get("reason", ""), attempt=values.get("attempt", 0),
                      mood=values.get("mood", ""), asserted=values.get("asserted", ""),
                      events=list(values.get("events", [])), waiting=bool(snap.next))


async def run_work_item(path: Path, *, mood: Mood | None = None, run_id: str | None = None,
                        on_event: OnEvent | None = None) -> RunOutcome:
    """Run a work item file until ASSERT, halt, budget end or an approval gate."""
    from choir.config import load_repo_config, load_work_item
    from choir.policy import load_policy
    from choir.verify import new_run_id

    item = load_work_item(path)
    load_policy(load_repo_config(Path(item.repo)))  # configuration errors before anything runs
    run_id = run_id or new_run_id(item.id)
    start = {"work_item": item, "run_id": run_id, "mood": (mood or item.mood).value,
             "attempt": 0, "round": 0, "history": [], "status": "running"}
    return await _drive(start, run_id, on_event)


async def resume(run_id: str, *, on_event: OnEvent | None = None) -> RunOutcome:
    return await _drive(None, run_id, on_event)


async def approve(run_id: str, *, reject: bool = False,
                  on_event: OnEvent | None = None) -> RunOutcome:
    from langgraph.types import Command

    return await _drive(Command(resume={"approved": not reject}), run_id, on_event)
