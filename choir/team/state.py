"""The plan driver's durable record: one JSON file per plan, replaced atomically (write,
fsync, rename) after every transition.

Each item's own run is checkpointed by LangGraph (``choir.graph.runner``) under its run id;
the record holds what the driver adds: each item's state, attempt, run id and commit, the
integration head, and the spend per member, saved together with the transition that caused
them. After kill -9, ``--resume`` reads it: a merged item is skipped; an item recorded
ASSERTed (its commit made, before the merge) is merged without running again; an item
recorded running continues its own run id from the run's last checkpoint; the integration
branch is reset to the recorded head, so a merge the record does not hold is redone, never
kept twice. A run's spend is added once, when the run ends, in the save that records its
outcome.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from choir._core.paths import choir_home

PENDING, RUNNING, ASSERTED, MERGED = "pending", "running", "asserted", "merged"
FAILED, BLOCKED = "failed", "blocked"


def plan_dir(plan_id: str) -> Path:
    return choir_home() / "plans" / plan_id


def load_state(plan_id: str) -> dict[str, Any] | None:
    path = plan_dir(plan_id) / "state.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_state(plan_id: str, state: dict[str, Any]) -> None:
    import datetime as dt

    state["updated"] = dt.datetime.now(dt.UTC).isoformat()
    folder = plan_dir(plan_id)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "state.json.tmp"
    with tmp.open("w") as fh:
        json.dump(state, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / "state.json")


def list_plans() -> list[dict[str, Any]]:
    root = choir_home() / "plans"
    found = []
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        state = load_state(child.name)
        if state is not None:
            found.append(state)
    return found
