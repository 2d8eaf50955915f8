"""The merge queue's moves, with its git and ledger work scripted (``FakeQueue``): heads are
names (``H0+a+b``), rounds are answered by the test, so every ordering is exact.

The real queue (git merge-tree, worktrees, rounds in sandboxes, the gate and the AHDB) is
run by ``tests/integration/test_team_queue.py``.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from choir.models.plan import PlanRecord, PlanRow, QueueEntry
from choir.team.moves import Moves
from choir.team.plan import Plan
from choir.team.queue import Verdict


class FakeQueue:
    def __init__(self, conflicts: tuple[tuple[str, str], ...] = ()) -> None:
        self.conflicts = set(conflicts)
        self.built: list[str] = []
        self.landed: list[str] = []

    def build(self, entry: QueueEntry, onto: str, start: str = "") -> QueueEntry | str:
        if (entry.item, onto) in self.conflicts:
            return f"merge conflict with the integration branch in: {entry.item}.txt"
        head = f"{onto}+{entry.item}"
        self.built.append(head)
        return entry.model_copy(update={"base": onto, "head": head, "tree": f"tree({head})",
                                        "status": "verifying"})

    def land(self, entry: QueueEntry, current: str) -> str | None:
        assert entry.base == current, "landed on a head it was not built on"
        self.landed.append(entry.head)
        return None

    def drop(self, item_id: str) -> None:
        return None


class FakeGit:
    """Worktrees for items sent back to run again: only which head each starts from."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []

    def add_worktree(self, path: Path, branch: str, start: str) -> None:
        self.started.append((path.parent.name, start))


def driver(queue: FakeQueue, parallel: int = 2) -> Moves:
    moves = Moves()
    moves.plan = Plan.model_validate({"id": "p", "max_parallel": parallel, "items": [
        {"id": i, "goal": i, "executor": {"command": "true"}} for i in "abc"]})
    moves.queue = queue  # type: ignore[assignment]
    moves.git = FakeGit()  # type: ignore[assignment]
    moves.trees = moves.dir = Path(tempfile.mkdtemp())
    return moves


def asserted(*items: str) -> PlanRecord:
    """Every item ASSERTed and queued in this order, nothing built yet."""
    return PlanRecord(plan="p", repo="/r", base="H0", integration="H0",
                      items={i: PlanRow(state="asserted", commit=f"c-{i}", attempt=1)
                             for i in items},
                      queue=tuple(QueueEntry(item=i, commit=f"c-{i}") for i in items))


def done(result: Any) -> asyncio.Future[Any]:
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    future.set_result(result)
    loop.close()
    return future


def verdict(moves: Moves, record: PlanRecord, item: str, head: str,
            passed: bool) -> PlanRecord:
    text = "integration PASS" if passed else "integration round FAIL: unit: FAIL"
    return moves.advance(moves.apply(record, ("verify", item, head),
                                     done(Verdict(passed, text, 1.0))))  # type: ignore[arg-type]


def heads(record: PlanRecord) -> list[tuple[str, str, str]]:
    return [(e.item, e.head, e.status) for e in record.queue]


def test_heads_are_built_on_each_other_and_verified_side_by_side() -> None:
    queue = FakeQueue()
    moves = driver(queue)
    record = moves.advance(asserted("a", "b", "c"))
    # A, then A+B, both verifying at once; C waits for room (max_parallel 2)
    assert heads(record) == [("a", "H0+a", "verifying"), ("b", "H0+a+b", "verifying"),
                             ("c", "", "waiting")]
    record = verdict(moves, record, "b", "H0+a+b", True)  # A+B passes first: it waits for A
    assert queue.landed == [] and record.integration == "H0"
    record = verdict(moves, record, "a", "H0+a", True)
    # A lands, then A+B at once (its round passed on exactly that head); C is built on it
    assert queue.landed == ["H0+a", "H0+a+b"]
    assert record.integration == "H0+a+b" and record.integration_tree == "tree(H0+a+b)"
    assert heads(record) == [("c", "H0+a+b+c", "verifying")]
    assert [record.items[i].state for i in "ab"] == ["merged", "merged"]


def test_a_failed_round_sends_its_item_back_and_the_heads_after_it_are_rebuilt_without_it(
        ) -> None:
    queue = FakeQueue()
    moves = driver(queue)
    record = moves.advance(asserted("a", "b", "c"))
    record = verdict(moves, record, "b", "H0+a+b", True)  # passed, but it holds A
    record = verdict(moves, record, "a", "H0+a", False)
    # A goes back for revision with the round's verdict; A+B is rebuilt as B alone, and C
    # (which had no head) is built on it: both verified again
    # (it starts again at once, from the integration head as it stands: H0)
    assert record.items["a"].state == "running" and record.items["a"].sent_back == 1
    assert record.items["a"].attempt == 2 and moves.git.started == [("a", "H0")]  # type: ignore[attr-defined]
    assert "integration round FAIL" in record.items["a"].feedback
    assert heads(record) == [("b", "H0+b", "verifying"), ("c", "H0+b+c", "verifying")]
    assert queue.landed == []  # A+B passed, and is never landed: it holds a failed item
    # a late answer for the head that was set aside decides nothing
    record = verdict(moves, record, "b", "H0+a+b", True)
    assert queue.landed == [] and heads(record)[0] == ("b", "H0+b", "verifying")
    record = verdict(moves, record, "b", "H0+b", True)
    record = verdict(moves, record, "c", "H0+b+c", True)
    assert queue.landed == ["H0+b", "H0+b+c"]
    assert record.integration == "H0+b+c" and not record.queue


def test_a_second_failure_fails_the_item_and_the_rest_still_lands() -> None:
    queue = FakeQueue()
    moves = driver(queue)
    record = asserted("a", "b")
    record = record.with_row("a", sent_back=1)  # it was sent back once already
    record = moves.advance(record)
    record = verdict(moves, record, "a", "H0+a", False)
    assert record.items["a"].state == "failed"
    assert heads(record) == [("b", "H0+b", "verifying")]
    record = verdict(moves, record, "b", "H0+b", True)
    assert queue.landed == ["H0+b"] and record.items["b"].state == "merged"


def test_a_conflict_on_a_speculative_head_waits_one_on_the_integration_head_goes_back(
        ) -> None:
    queue = FakeQueue(conflicts=(("b", "H0+a"), ("b", "H0+c")))
    moves = driver(queue, parallel=3)
    record = moves.advance(asserted("a", "b", "c"))
    # B conflicts with A's change, which is not landed yet: B and what follows it wait
    assert heads(record) == [("a", "H0+a", "verifying"), ("b", "", "waiting"),
                             ("c", "", "waiting")]
    record = verdict(moves, record, "a", "H0+a", False)  # A fails: B is tried on H0 alone
    assert heads(record) == [("b", "H0+b", "verifying"), ("c", "H0+b+c", "verifying")]
    # and a conflict with the integration head itself sends the item back at once
    queue.conflicts.add(("a", "H0"))
    record = moves.advance(asserted("a"))
    assert record.items["a"].state == "running" and not record.queue
    assert record.items["a"].sent_back == 1 and "merge conflict" in record.items["a"].feedback


def test_feedback_a_member_gets_says_when_it_was_cut() -> None:
    """A conflict over many files or a long failing round was cut to 2,000 characters with
    no mark, so the member read a partial list as the whole (failing on the old code)."""
    from choir.team.moves import send_back
    from choir.team.queue import FEEDBACK_CHARS, bounded

    record = PlanRecord(plan="p", repo="r", base="0" * 40, integration="0" * 40,
                        items={"a": PlanRow(member="m", goal="g", state="asserted")})
    long = "merge conflict with the integration branch in: " + ", ".join(
        f"src/module_{n}.py" for n in range(400))
    sent = send_back(record, "a", long).items["a"].feedback
    assert len(sent) <= FEEDBACK_CHARS and sent.endswith("the rest cut]"), sent[-80:]
    assert str(len(long)) in sent and bounded("short") == "short"
