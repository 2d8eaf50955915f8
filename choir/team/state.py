"""The plan's published record: ``plans/PLAN_ID/state.json`` under CHOIR_HOME.

The plan driver's durable state is its LangGraph checkpoint (``choir.team.driver``); this
file is what everything else reads (``choir gate PLAN_ID``, ``choir promote``, ``choir runs``,
``choir view``): the checkpointed ``PlanRecord`` as JSON, rewritten at the start of every
driver step, so it never shows a transition the checkpoint does not hold. It is replaced
atomically (write, rename) for readers; it is not fsynced, because a crash loses nothing
the next ``--resume`` does not write again from the checkpoint.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from choir._core import fsopen
from choir._core.paths import choir_home
from choir.models.plan import PlanRecord

PENDING, RUNNING, ASSERTED, MERGED = "pending", "running", "asserted", "merged"
FAILED, BLOCKED, SPLIT = "failed", "blocked", "split"


def plan_dir(plan_id: str) -> Path:
    return choir_home() / "plans" / plan_id


def load_state(plan_id: str) -> dict[str, Any] | None:
    try:  # never through a link, never from a FIFO (a planted one would hang the reader)
        data = json.loads(fsopen.read_bytes(plan_dir(plan_id), "state.json", None))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_state(plan_id: str, state: dict[str, Any], *, sync: bool = True) -> None:
    """Replace the record with ``state`` (``sync``: fsynced too, for a write nothing else
    can redo, such as a promotion's)."""
    state["updated"] = dt.datetime.now(dt.UTC).isoformat()
    folder = plan_dir(plan_id)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "state.json.tmp"
    with tmp.open("w") as fh:
        json.dump(state, fh, indent=1, sort_keys=True)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, folder / "state.json")


def publish(record: PlanRecord) -> None:
    """The checkpointed record, for its readers."""
    save_state(record.plan, record.model_dump(mode="json"), sync=False)


def seed_record(plan_id: str) -> PlanRecord | None:
    """A record published by the driver before it was checkpointed (a plan started by an
    earlier Choir), to continue it from; None when there is none or it does not parse."""
    from pydantic import ValidationError

    data = load_state(plan_id)
    if data is None:
        return None
    known = set(PlanRecord.model_fields)
    try:
        return PlanRecord.model_validate({k: v for k, v in data.items() if k in known})
    except ValidationError:
        return None


def list_plans() -> list[dict[str, Any]]:
    root = choir_home() / "plans"
    found = []
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        state = load_state(child.name)
        if state is not None:
            found.append(state)
    return found
