"""The plan driver's transitions: what a step does to the record (``choir.team.driver``).

``advance`` makes every move the record allows without waiting: blocked items, the queue's
first entry landed or sent back (and the entries after a failed one rebuilt), new heads
built, split items' whole checks begun, ready items started. ``apply`` takes a finished
task's result into the record. Each returns a new record; the driver checkpoints it.
Their side effects (worktrees, commits, heads, landings) are each safe to repeat from the
last checkpoint: see the module docstrings of ``driver`` and ``queue``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from choir._core.failpoints import failpoint
from choir._core.ids import new_run_id
from choir.evidence.git import GitRepo
from choir.evidence.tree import commit_outside
from choir.evidence.worktrees import planted_repositories
from choir.exceptions import UserError
from choir.models.plan import PlanRecord, PlanRow, QueueEntry, Spend
from choir.team import parts, schedule
from choir.team.plan import Plan
from choir.team.queue import MergeQueue, Verdict, bounded, ref_name
from choir.team.state import ASSERTED, BLOCKED, FAILED, MERGED, PENDING, RUNNING, SPLIT

INTEGRATION_RETRIES = 1  # a conflict or integration FAIL sends an item back once
Job = tuple[str, str, str]  # (run | verify | whole, item id, attempt or head)


class Moves:
    plan: Plan
    git: GitRepo
    queue: MergeQueue
    trees: Path
    dir: Path

    # -- paths -------------------------------------------------------------------------------
    def item_tree(self, item_id: str) -> Path:
        """An item's worktree, alone in a folder of its own: a sandboxed member may read the
        folder around its repo (``../fix.py``), which must not hold another member's work."""
        return self.trees / "items" / item_id / "tree"

    def item_file(self, item_id: str, attempt: int) -> Path:
        return self.dir / "items" / f"{item_id}.{attempt}.json"

    # -- moves without waiting ---------------------------------------------------------------
    def advance(self, record: PlanRecord) -> PlanRecord:
        while True:
            moved = self._one_pass(record)
            if moved == record:
                return record
            record = moved

    def _one_pass(self, record: PlanRecord) -> PlanRecord:
        for item_id, why in schedule.blocked(record).items():
            state = FAILED if record.items[item_id].state == SPLIT else BLOCKED
            record = record.with_row(item_id, state=state, last=why)
        record = self._land_or_send_back(record)
        record = self._build_heads(record)
        for item_id in schedule.whole_ready(record):
            record = self._begin_whole(record, item_id)
        return self._start_items(record)

    def _land_or_send_back(self, record: PlanRecord) -> PlanRecord:
        if not record.queue or record.queue[0].status not in ("passed", "failed"):
            return record
        first, rest = record.queue[0], record.queue[1:]
        problem = first.verdict if first.status == "failed" else \
            self.queue.land(first, record.integration)
        self.queue.drop(first.item)
        if problem is None:
            row = record.items[first.item]
            return record.model_copy(update={
                "integration": first.head, "integration_tree": first.tree, "queue": rest,
                "items": {**record.items, first.item: row.model_copy(update={
                    "state": MERGED, "feedback": "",
                    "last": f"ASSERTed; merged; {first.verdict}"[:300]})}})
        # the entries after it hold its change: each is rebuilt without it
        for entry in rest:
            if entry.head:
                self.queue.drop(entry.item)
        rebuilt = tuple(QueueEntry(item=e.item, commit=e.commit) for e in rest)
        record = record.model_copy(update={"queue": rebuilt})
        if first.status == "failed":
            return send_back(record, first.item, problem)
        return record.with_row(first.item, state=FAILED, last=problem[:300])

    def _build_heads(self, record: PlanRecord) -> PlanRecord:
        """Heads for waiting entries, in order, while fewer than ``max_parallel`` are built
        and unlanded; a conflict on the integration head itself sends the item back, one on
        a speculative head waits until the entries before it land (or are set aside)."""
        entries = list(record.queue)
        for n, entry in enumerate(entries):
            if entry.status != "waiting":
                continue
            if n >= self.plan.max_parallel:
                break
            onto = entries[n - 1].head if n else record.integration
            built = self.queue.build(entry, onto, record.items[entry.item].base)
            if isinstance(built, str):
                if n:
                    break
                entries.pop(0)
                record = send_back(record.model_copy(update={"queue": tuple(entries)}),
                                   entry.item, built)
                return record
            entries[n] = built
            record = record.with_row(entry.item, last="ASSERTed; integration round running")
        return record.model_copy(update={"queue": tuple(entries)})

    def _begin_whole(self, record: PlanRecord, item_id: str) -> PlanRecord:
        """A split item whose parts all merged: checked whole on the integration head."""
        head = record.integration
        self.git.add_worktree(self.trees / "whole" / item_id,
                              ref_name(self.plan.id, "whole", item_id), head)
        return record.with_row(item_id, whole_head=head,
                               whole_tree=record.integration_tree or "",
                               whole_session=new_run_id("verify"),
                               last="parts merged; verifying it whole")

    def _start_items(self, record: PlanRecord) -> PlanRecord:
        ready = schedule.ready(record)
        if not ready:
            return record
        spent = schedule.budget_spent(self.plan, record)
        if spent is not None:  # nothing more starts; the rest is reported blocked
            for item_id in ready:
                record = record.with_row(item_id, state=BLOCKED,
                                         last=f"plan budget spent: {spent}")
            return record
        for item_id in schedule.startable(self.plan, record, ready):
            row = record.items[item_id]
            attempt, head = row.attempt + 1, record.integration
            tree = self.item_tree(item_id)
            self.git.add_worktree(tree, ref_name(self.plan.id, "item", item_id), head)
            item = schedule.work_item(self.plan, record, item_id, tree)
            if row.feedback:  # bounded: the conflict, the failing verifier, the split piece
                item = item.model_copy(update={"goal": f"{item.goal}\n\nFeedback (attempt "
                                               f"{attempt}):\n{row.feedback}"})
            path = self.item_file(item_id, attempt)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(item.model_dump(mode="json",
                                                       exclude={"split_of", "focus"})))
            record = record.with_row(item_id, state=RUNNING, attempt=attempt, base=head,
                                     run_id=schedule.run_id(self.plan, item_id, row, attempt),
                                     last="")
        return record

    # -- a finished task ---------------------------------------------------------------------
    def apply(self, record: PlanRecord, job: Job, task: asyncio.Task[Any]) -> PlanRecord:
        kind, item_id, key = job
        error = task.exception()
        row = record.items[item_id]
        if kind == "run" and (row.state != RUNNING or str(row.attempt) != key):
            return record  # a run the record moved past (never after a checkpoint)
        if error is not None:
            if kind == "verify":
                return self._verified(record, item_id, key, Verdict(
                    False, f"integration round error: {type(error).__name__}: {error}", 0.0))
            return record.with_row(item_id, state=FAILED,
                                   last=f"error: {type(error).__name__}: {error}"[:300])
        if kind == "run":
            outcome, seconds = task.result()
            return self._ran(record, item_id, outcome, seconds)
        if kind == "verify":
            return self._verified(record, item_id, key, task.result())
        return self._whole_checked(record, item_id, key, task.result())

    def _ran(self, record: PlanRecord, item_id: str, outcome: dict[str, Any],
             seconds: float) -> PlanRecord:
        row = record.items[item_id]
        spent = outcome["usage"].get("total", {})
        who = row.member or "(own executor)"
        old = record.spend.get(who) or Spend()
        # counted once: in the step that records the run's outcome
        record = record.model_copy(update={"spend": {**record.spend, who: Spend(
            prompt_tokens=old.prompt_tokens + int(spent.get("prompt_tokens", 0)),
            completion_tokens=old.completion_tokens + int(spent.get("completion_tokens", 0)),
            cost_usd=round(old.cost_usd + float(spent.get("cost_usd", 0.0)), 6))}})
        record = record.with_row(item_id, run_s=round(row.run_s + seconds, 3))
        if outcome["status"] == "split" and outcome.get("parts"):
            return parts.add_parts(record, self.plan.id, item_id, outcome["parts"])
        if outcome["status"] != "asserted":
            return record.with_row(item_id, state=FAILED,
                                   last=f"{outcome['status']}: {outcome['reason']}"[:300])
        try:
            commit = self._commit(item_id, row)
        except (UserError, RuntimeError) as exc:  # its worktree gone or unusable: not merged
            return record.with_row(item_id, state=FAILED, last=f"commit: {exc}"[:300])
        unverified = self._outside_tree(commit, row.base)
        if unverified:
            return record.with_row(item_id, state=FAILED, last=unverified[:300])
        failpoint("plan:committed")
        return record.with_row(item_id, state=ASSERTED, commit=commit,
                               last="ASSERTed; queued for merge").model_copy(update={
            "queue": (*record.queue, QueueEntry(item=item_id, commit=commit))})

    def _commit(self, item_id: str, row: PlanRow) -> str:
        """The worktree committed on the item's branch, through the git folder recorded when
        it was made (never the ``.git`` the member may have rewritten; filters and hooks the
        config names pinned off). A commit made before a crash is the commit: the run is
        over, nothing changes the tree since."""
        work = self.git.worktree_at(self.item_tree(item_id))
        if work is None:
            raise RuntimeError(f"the worktree of {item_id} is gone")
        planted = planted_repositories(work)
        if planted:  # before any git runs there: git would start git in each, as its config says
            raise UserError("a repository inside the worktree (" + ", ".join(planted) +
                            "): git would run in it under the member's own config, and no "
                            "round verified its content; nothing was committed")
        message = f"{item_id}: {row.goal[:60]}"
        work.write("add", "-A")
        # nothing to commit: the item changed nothing, or its commit was made before a crash
        if work.write("commit", "-q", "--no-verify", "-m", message,
                      check=False).returncode and work.rev("HEAD") == row.base:
            work.write("commit", "-q", "--allow-empty", "--no-verify", "-m", message)
        return work.head_commit() or ""

    def _outside_tree(self, commit: str, base: str) -> str:
        """Why ``commit`` may not merge, if what its tree hash leaves out is not its base's
        ('' when it is):

        - its submodule entries: a nested repository the member made in its worktree is no
          file of the tree its round verified (a folder that is a repository of its own),
          yet ``git add -A`` commits it, as another repository's commit nobody verified;
        - how its ``.gitattributes`` files say a checkout converts files (``ident``,
          ``text``/``eol``, a filter, an encoding): its rounds read the blobs' bytes, a
          person checking it out would get others."""
        read = commit_outside(self.git.root, commit, base)
        if read is None:
            return "commit: its submodule entries and .gitattributes files cannot be read back"
        (submodules, attributes), (submodules_before, attributes_before) = read
        changed = _differing(submodules, submodules_before, None)
        if changed:
            return ("commit: submodule entries no round verified (a nested repository's "
                    "commit, outside the tree hash): " + ", ".join(changed))
        changed = _differing(attributes, attributes_before, ())
        if changed:
            return ("commit: .gitattributes changes how git converts files on checkout (ident, "
                    "text, eol, filter, encoding; a checkout would differ from the bytes its "
                    "rounds verified): " + ", ".join(changed))
        return ""

    def _verified(self, record: PlanRecord, item_id: str, head: str,
                  verdict: Verdict) -> PlanRecord:
        entries = list(record.queue)
        for n, entry in enumerate(entries):
            if entry.item == item_id and entry.head == head and entry.status == "verifying":
                entries[n] = entry.model_copy(update={
                    "status": "passed" if verdict.passed else "failed",
                    "verdict": bounded(verdict.verdict)})
                row = record.items[item_id]
                return record.with_row(item_id, integration_s=round(
                    row.integration_s + verdict.seconds, 3)).model_copy(
                    update={"queue": tuple(entries)})
        return record  # a head set aside since: its round decides nothing

    def _whole_checked(self, record: PlanRecord, item_id: str, head: str,
                       verdict: Verdict) -> PlanRecord:
        row = record.items[item_id]
        if row.state != SPLIT or row.whole_head != head:
            return record
        problem = None if not verdict.passed else \
            self.queue.record_whole(item_id, head, row.whole_tree)
        if verdict.passed and problem is None:
            return record.with_row(item_id, state=MERGED, commit=head,
                                   last="parts merged; verified whole")
        return record.with_row(item_id, state=FAILED,
                               last=(problem or f"parts merged, but {verdict.verdict}")[:300])


def send_back(record: PlanRecord, item_id: str, feedback: str) -> PlanRecord:
    """A conflict or an integration FAIL: the item runs again from the integration head
    with the feedback (once), else it failed."""
    row = record.items[item_id]
    if row.sent_back >= INTEGRATION_RETRIES:
        return record.with_row(item_id, state=FAILED, last=bounded(feedback))
    return record.with_row(item_id, state=PENDING, sent_back=row.sent_back + 1,
                           last=feedback[:300], feedback=bounded(feedback))


__all__ = ["INTEGRATION_RETRIES", "Job", "Moves", "send_back"]


def _differing(found: Mapping[str, object], before: Mapping[str, object],
               absent: object) -> list[str]:
    """The paths whose value differs between ``found`` and ``before`` (``absent`` standing
    for a path one of them lacks), sorted."""
    return sorted(p for p in {*found, *before} if found.get(p, absent) != before.get(p, absent))
