"""Which items may start: pure decisions over the plan and its record (the team
contract: an ASSERT is success, a failed round is revision, a halt is failure).

An item is ready when everything it depends on is merged; it is blocked when anything it
depends on failed or is blocked; it starts when the plan's ``max_parallel``, its member's
``concurrency`` and the plan-wide budget allow. Nothing here touches git or the stores.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from choir.models import Mood, WorkItem
from choir.models.plan import PartSpec, PlanRecord, PlanRow
from choir.team.plan import Plan, item_key
from choir.team.state import BLOCKED, FAILED, MERGED, PENDING, RUNNING, SPLIT

DONE_BAD = (FAILED, BLOCKED)


def blocked(record: PlanRecord) -> dict[str, str]:
    """Items that can no longer start, with why: a dependency failed or is blocked, or (a
    split item) one of its parts did."""
    out: dict[str, str] = {}
    for item_id, row in record.items.items():
        if row.state == PENDING:
            bad = [d for d in row.depends_on if record.items[d].state in DONE_BAD]
            if bad:
                out[item_id] = f"blocked by {', '.join(bad)}"
        elif row.state == SPLIT:
            bad = [p for p in row.parts if record.items[p].state in DONE_BAD]
            if bad:
                out[item_id] = f"part {', '.join(bad)} did not merge"
    return out


def ready(record: PlanRecord) -> list[str]:
    """Pending items whose dependencies are all merged, in the plan's order."""
    return [item_id for item_id, row in record.items.items() if row.state == PENDING and
            all(record.items[d].state == MERGED for d in row.depends_on)]


def whole_ready(record: PlanRecord) -> list[str]:
    """Split items whose parts are all merged and whose whole check has not started."""
    return [item_id for item_id, row in record.items.items() if row.state == SPLIT and
            not row.whole_head and all(record.items[p].state == MERGED for p in row.parts)]


def budget_spent(plan: Plan, record: PlanRecord) -> str | None:
    """Which of the plan's limits is reached (item runs, tokens, cost, wall time)."""
    limit, spend = plan.budget, record.spend.values()
    used = {"attempts": sum(r.attempt for r in record.items.values()),
            "tokens": sum(s.prompt_tokens + s.completion_tokens for s in spend),
            "cost_usd": round(sum(s.cost_usd for s in spend), 6),
            "wall_s": round(time.time() - record.started, 1)}
    for name, value in used.items():
        cap = getattr(limit, name)
        if cap is not None and value >= cap:
            return f"{name} {value}/{cap}"
    return None


def startable(plan: Plan, record: PlanRecord, candidates: list[str]) -> list[str]:
    """The candidates that may start now: within ``max_parallel``, each member's
    ``concurrency`` (an item with its own executor has no member limit) and the item runs
    the plan's ``attempts`` budget has left (each start is one: checking the budget once
    before starting several let a budget of one start as many as ``max_parallel``)."""
    busy = [r.member for r in record.items.values() if r.state == RUNNING]
    cap = plan.budget.attempts
    left = None if cap is None else cap - sum(r.attempt for r in record.items.values())
    out: list[str] = []
    for item_id in candidates:
        member = record.items[item_id].member
        if len(busy) >= plan.max_parallel or (left is not None and len(out) >= left):
            break
        if member and busy.count(member) >= plan.members[member].concurrency:
            continue
        busy.append(member)
        out.append(item_id)
    return out


def run_id(plan: Plan, item_id: str, row: PlanRow, attempt: int) -> str:
    """An item run's id: ``PLAN.ITEM.ATTEMPT``; a part's ends in ``.part`` (its id holds a
    ``~``, which run ids refuse), so it never equals a plan item's, whose ends in digits."""
    if row.split_of:
        return f"{item_key(plan.id, item_id.replace('~', '-part'))}.{attempt}.part"
    return f"{item_key(plan.id, item_id)}.{attempt}"


def work_item(plan: Plan, record: PlanRecord, item_id: str, repo: Path) -> WorkItem:
    """The item as a plain work item over ``repo`` (its worktree); a part is its split
    item's, narrowed to the part's goal, scope, verifiers and share of the budget."""
    row = record.items[item_id]
    if row.part is None:
        return plan.work_item(item_id, repo)
    whole = plan.work_item(row.split_of, repo)
    return whole.model_copy(update={
        "id": item_key(plan.id, item_id), "goal": row.part.goal, "scope": row.part.scope,
        "required_verifiers": row.part.required_verifiers,
        "max_attempts": row.part.max_attempts,
        "mood": split_mood(whole.mood, [row.part])})


def split_mood(mood: Mood, parts: Iterable[PartSpec]) -> Mood:
    """The stricter of ``mood`` and the one its split climbed to (a part's record)."""
    from choir.director import RANK

    return max([mood, *(p.mood for p in parts if p.mood is not None)], key=RANK.__getitem__)
