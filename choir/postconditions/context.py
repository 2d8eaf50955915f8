"""The context a postcondition receives: which work item, which action, which run.

It travels to the harness in ``CHOIR_PC_CONTEXT`` (JSON) and is written back into the run's
``out/postcondition.json``; raw output never flows the other way.
"""

from __future__ import annotations

import json
from typing import Any

from choir.models import VerifierKind, VerifierSpec, WorkItem


def context_of(item: WorkItem | None, *, run_id: str | None = None) -> dict[str, Any]:
    if item is None:
        return {"work_item": None, "action": {}, "run_id": run_id}
    return {
        "work_item": {"id": item.id, "goal": item.goal, "decision_type": item.decision_type,
                      "blast_radius": str(item.blast_radius)},
        "action": dict(item.action),
        "run_id": run_id,
    }


def context_env(spec: VerifierSpec, item: WorkItem | None, *,
                run_id: str | None = None) -> dict[str, str]:
    """The step environment that hands ``item``'s context to a postcondition (none for
    other verifiers)."""
    if spec.kind is not VerifierKind.POSTCONDITION:
        return {}
    return {"CHOIR_PC_CONTEXT": json.dumps(context_of(item, run_id=run_id), sort_keys=True,
                                           default=str)}
