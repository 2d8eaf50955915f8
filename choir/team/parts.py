"""A split in a plan: the parts become items of the plan (docs/concepts.md, split).

When an item keeps failing the same way and its failure divides (``choir.director.split``),
its run ends with status ``split`` and hands its parts back (``hand_back_splits``). Each part
becomes an item of the plan: id ``ITEM~K`` (``~`` is refused in the ids users write), the
split item's member and dependencies, a goal narrowed to its piece, the feedback about that
piece, and a share of what is left of the split item's attempt budget (the shares add up to
what is left, so a split never multiplies the budget; they are divided because the parts
run side by side). Each part runs, is verified, gated and merged like any item: each merge
leaves the integration tree verified whole. When every part is merged, the split item is
verified whole on the integration head (its own claim, its own mood), and only that merges
it; its dependents wait for it. A part that fails fails the split item.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from choir.models import Result, VerificationReport
from choir.models.plan import PartSpec, PlanRecord
from choir.team.queue import bounded
from choir.team.state import SPLIT


def feedback(reports: Sequence[VerificationReport]) -> str:
    """What a part is told about its piece: the split item's failing reports on it, each once
    (the item's last tree was verified by several rounds and lenses alike)."""
    from choir.executors.prompt import feedback_text

    seen: dict[tuple[str, str, tuple[str | None, ...]], VerificationReport] = {}
    for report in reports:
        if report.result is not Result.PASS:
            key = (report.verifier, report.summary,
                   tuple(s.test_id for s in report.failure_signatures))
            seen.setdefault(key, report)
    return bounded(feedback_text(list(seen.values())))


def shares(remaining: int, count: int) -> list[int]:
    """``remaining`` attempts divided among ``count`` parts, the first ones taking the rest."""
    base, extra = divmod(remaining, count)
    return [base + (k < extra) for k in range(count)]


def add_parts(record: PlanRecord, plan_id: str, item_id: str,
              handed: list[dict[str, Any]]) -> PlanRecord:
    """The record with ``item_id`` split: its parts added as items, it waiting for them."""
    row = record.items[item_id]
    remaining = int(handed[0]["work_item"]["max_attempts"])  # what is left, per split.py
    names: list[str] = []
    for part, share in zip(handed, shares(remaining, len(handed)), strict=True):
        item = part["work_item"]
        part_id = str(item["id"]).removeprefix(f"{plan_id}.")
        names.append(part_id)
        record = record.with_row(
            part_id, member=row.member, goal=str(item["goal"])[:300],
            depends_on=row.depends_on, split_of=item_id,
            feedback=bounded(str(part.get("feedback", ""))),
            part=PartSpec(goal=str(item["goal"]), scope=tuple(item.get("scope", ())),
                          required_verifiers=tuple(item.get("required_verifiers", ())),
                          max_attempts=max(1, share), mood=item.get("mood"),
                          floor=tuple(part.get("floor", ()))))
    return record.with_row(item_id, state=SPLIT, parts=tuple(names),
                           last=f"split into {', '.join(names)}"[:300])
