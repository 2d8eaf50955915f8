"""A team plan's record: what the plan driver checkpoints after every transition.

The driver (``choir.team.driver``) is a LangGraph graph whose one state value is a
``PlanRecord``; it is checkpointed like a ``choir run`` (synchronously, after every step) and
published as ``plans/PLAN_ID/state.json`` (``record.model_dump(mode="json")``) for ``choir
gate``, ``choir promote``, ``choir runs`` and ``choir view``. Frozen: every transition makes
a new record (``PlanRecord.with_row``), so a step either happened whole or not at all.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from choir.models._base import Frozen
from choir.models.workitem import Mood


class PartSpec(Frozen):
    """A part a split item handed back to the plan (docs/concepts.md, split): its own goal, the
    failing piece it is about, and its share of the split item's attempt budget."""

    goal: str
    scope: tuple[str, ...] = ()
    required_verifiers: tuple[str, ...] = ()
    max_attempts: int = Field(ge=1, le=100)
    # the mood the split climbed to and the verifiers the split item's rounds ran: the parts
    # run in that mood, and the whole is verified in it with those (review 17b, F2)
    mood: Mood | None = None
    floor: tuple[str, ...] = ()


class Spend(Frozen):
    """Tokens and cost of a member's runs (``(own executor)``: items with an executor)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


class PlanRow(Frozen):
    """One item of the plan (an item of the plan file, or a part split from one)."""

    state: str = "pending"  # pending running asserted merged failed blocked split
    attempt: int = 0  # item runs started for it (each a run of its own)
    run_id: str = ""
    member: str = ""
    last: str = ""  # the last verdict, bounded
    feedback: str = ""  # bounded: what the next attempt is told (a conflict, a verifier)
    goal: str = ""  # the first 300 characters, for a reader of the record alone
    depends_on: tuple[str, ...] = ()
    base: str = ""  # the integration head the running attempt started from
    commit: str = ""  # ASSERTed: the commit of exactly its tree; merged: what was merged
    sent_back: int = 0  # conflicts and integration FAILs so far
    run_s: float = 0.0  # seconds inside its runs (the driver's own cost is the rest)
    integration_s: float = 0.0  # seconds of its integration rounds
    split_of: str = ""  # a part: the item it was split from
    part: PartSpec | None = None
    parts: tuple[str, ...] = ()  # a split item: its parts, merged before it is checked whole
    whole_head: str = ""  # a split item whose parts merged: the head it is verified on
    whole_tree: str = ""  # and that head's tree hash
    whole_session: str = ""  # the run id of that round (recorded before it starts)


class QueueEntry(Frozen):
    """An ASSERTed item in the merge queue: its speculative integration head, built on the
    head of the entry before it (or on the integration head), and that head's round."""

    item: str
    commit: str
    base: str = ""  # what it is merged onto; "" until its head is built
    head: str = ""
    tree: str = ""  # the head's tree hash: exactly what its integration round verifies
    session: str = ""  # the run id of its integration round (recorded before it starts)
    status: Literal["waiting", "verifying", "passed", "failed"] = "waiting"
    verdict: str = ""


class PlanRecord(Frozen):
    schema_version: int = 1
    plan: str
    plan_file: str = ""
    repo: str
    base: str  # the base commit the integration branch started from
    status: str = "running"
    integration: str  # the integration branch's head: every merge on it verified
    integration_tree: str | None = None
    started: float = 0.0
    updated: str = ""
    items: dict[str, PlanRow] = Field(default_factory=dict)
    queue: tuple[QueueEntry, ...] = ()
    spend: dict[str, Spend] = Field(default_factory=dict)

    def with_row(self, item_id: str, **fields: object) -> PlanRecord:
        """The record with ``item_id``'s row changed (a new row: ``fields`` over defaults)."""
        old = self.items.get(item_id) or PlanRow()
        return self.model_copy(update={"items": {**self.items, item_id: old.model_copy(
            update=fields)}})
