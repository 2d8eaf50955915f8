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

import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from choir.exceptions import UserError


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
    """The node: one work item through Choir's loop; ``{"outcomes": [its outcome]}``."""
    from choir.graph import runner
    from choir.team.parts import feedback

    run_id = state.get("run_id")
    outcome = None
    if state.get("resume") and run_id:
        try:
            outcome = await runner.resume(run_id)
        except UserError as exc:  # killed before its first checkpoint: start it afresh
            if not str(exc).startswith("no run "):
                raise
    if outcome is None:
        outcome = await runner.run_work_item(
            Path(state["work_item"]), run_id=run_id, part=state.get("part", False),
            hand_back_splits=state.get("hand_back_splits", False))
    parts = [{"work_item": part.model_dump(mode="json"), "feedback": feedback(reports)}
             for part, reports in outcome.parts]
    return {"outcomes": [{"status": outcome.status, "reason": outcome.reason,
                          "run_id": outcome.run_id, "work_item": outcome.work_item,
                          "asserted": outcome.asserted, "attempt": outcome.attempt,
                          "mood": outcome.mood, "usage": outcome.usage, "parts": parts}]}


def work_item_graph() -> Any:
    """The compiled subgraph (one node, ``verified_work_item``); see the module docstring."""
    graph = StateGraph(WorkItemState, input_schema=WorkItemIn, output_schema=WorkItemOut)
    graph.add_node("verified_work_item", verified_work_item)
    graph.add_edge(START, "verified_work_item")
    graph.add_edge("verified_work_item", END)
    return graph.compile()
