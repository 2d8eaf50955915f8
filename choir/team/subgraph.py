"""The verified work-item loop as a LangGraph subgraph, for a node in a user's own graph.

``work_item_graph()`` is a compiled ``StateGraph`` over ``WorkItemState``: give it a work
item file (``work_item``) and optionally a ``run_id``; it drives Choir's whole loop on it
(execute, Director plan, green threads, attest, adjudicate; durable under its run id, in its
own sandbox) and returns its outcome, appended to ``outcomes``. Placed as a node of a parent
graph that declares ``outcomes`` (a list with ``operator.add``), it composes like any
subgraph: a supervisor routes to it, or a map-reduce fans out with ``Send`` to one copy per
work item. Only an ``asserted`` outcome is verified work; everything else is a signal
(``halted``, ``exhausted``, ``awaiting_approval``).

The plan driver runs every item through this same subgraph (``choir.team.driver``).
"""

from __future__ import annotations

import asyncio
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from choir.exceptions import UserError

INFRA_RETRIES = 2  # resumes of a run the infrastructure stopped, before its error is final
INFRA_WAIT_S = 1.0  # before the first; twice that before the second


class WorkItemIn(TypedDict, total=False):
    """What the subgraph takes (a ``Send`` payload, or the parent's keys of these names)."""

    work_item: str  # a work item file (YAML or JSON), as ``choir run`` takes
    run_id: str  # default: a new one; with ``resume``, the run to continue
    resume: bool  # continue ``run_id`` from its last checkpoint when it has one
    # a split ends the run with its parts (status "split"): a plan adds them as its own items
    hand_back_splits: bool
    part: bool  # the work item is such a part (its id holds the ``~`` of parts)


class WorkItemOut(TypedDict):
    """What flows back to the parent: one outcome per run, appended (so a map-reduce over
    many ``Send``s collects them all; the parent declares ``outcomes`` with ``operator.add``).
    Each outcome: status, reason, run_id, work_item, asserted, attempt, mood, usage, and
    (status ``split``) ``parts``: each part's work item and the bounded feedback on its
    piece."""

    outcomes: Annotated[list[dict[str, Any]], operator.add]


class WorkItemState(WorkItemIn, total=False):
    outcomes: Annotated[list[dict[str, Any]], operator.add]


async def verified_work_item(state: WorkItemState) -> dict[str, Any]:
    """The node: one work item through Choir's loop; ``{"outcomes": [its outcome]}``.

    A run the infrastructure stopped (its executor's sandbox failed: no attempt charged,
    ``SandboxError``) is resumed where it stopped, up to ``INFRA_RETRIES`` times, a little
    later each time; then the error is the node's."""
    from choir.exceptions import SandboxError
    from choir.team.parts import feedback

    run_id = state.get("run_id")
    resume = bool(state.get("resume"))
    for tries in range(INFRA_RETRIES + 1):
        try:
            outcome = await _once(state, run_id, resume=resume)
            break
        except SandboxError:
            if tries == INFRA_RETRIES or not run_id:
                raise
            resume = True
            await asyncio.sleep(INFRA_WAIT_S * (tries + 1))
    parts = [{"work_item": part.model_dump(mode="json"), "feedback": feedback(reports),
              "floor": list(outcome.floor)} for part, reports in outcome.parts]
    return {"outcomes": [{"status": outcome.status, "reason": outcome.reason,
                          "run_id": outcome.run_id, "work_item": outcome.work_item,
                          "asserted": outcome.asserted, "attempt": outcome.attempt,
                          "mood": outcome.mood, "usage": outcome.usage, "parts": parts}]}


async def _once(state: WorkItemState, run_id: str | None, *, resume: bool) -> Any:
    from choir.graph import runner

    if resume and run_id:
        try:
            return await runner.resume(run_id)
        except UserError as exc:  # killed before its first checkpoint: start it afresh
            if not str(exc).startswith("no run "):
                raise
    return await runner.run_work_item(
        Path(state["work_item"]), run_id=run_id, part=state.get("part", False),
        hand_back_splits=state.get("hand_back_splits", False))


def work_item_graph() -> Any:
    """The compiled subgraph (one node, ``verified_work_item``); see the module docstring."""
    graph = StateGraph(WorkItemState, input_schema=WorkItemIn, output_schema=WorkItemOut)
    graph.add_node("verified_work_item", verified_work_item)
    graph.add_edge(START, "verified_work_item")
    graph.add_edge("verified_work_item", END)
    return graph.compile()
