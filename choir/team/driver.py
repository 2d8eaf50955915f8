"""The plan driver: a LangGraph graph, checkpointed like ``choir run``.

Its state is one ``PlanRecord`` (``choir.models.plan``). The ``step`` node runs again and
again: it publishes the record it was given (so ``state.json`` never shows what the
checkpoint does not hold), starts the work the record says is in flight and has no task in
this process (item runs, integration rounds, a split item's whole check), makes every
transition the record allows (blocked items, the merge queue's landings and rebuilds, new
heads, new starts), and when there is none, waits for the first task to finish and applies
its result. Each step's record is checkpointed before the next step starts
(``durability="sync"``), and work starts only from a checkpointed record: a run only once
its row is recorded running with its worktree made, a round only once its head is recorded.

So kill -9 anywhere, then ``choir plan run --resume ID``, continues from the last step: an
item recorded running continues its own run from that run's checkpoint (same run id, never
a new attempt); a finished run's outcome is read back, not run again, and its spend is
added in the one step that records the outcome; a recorded head is verified again or its
live ASSERT reused; a landing already done is recognised (``choir.team.queue``).

Items run side by side, each in its own worktree made from the integration head as it stands
when the item becomes ready; the user's checkout is never touched: only refs
(``choir/plan/...``) and worktrees outside CHOIR_HOME.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import shutil
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypedDict

from choir._core.paths import choir_home
from choir.app.gate import check_gate
from choir.evidence.git import GitRepo, locate
from choir.evidence.worktrees import drop_worktree
from choir.exceptions import UserError
from choir.models.plan import PlanRecord, PlanRow
from choir.team import schedule
from choir.team.moves import Job, Moves
from choir.team.plan import Plan
from choir.team.queue import (
    MergeQueue,
    Verdict,
    integration_branch,
    ref_name,
    refuse_checked_out,
)
from choir.team.state import MERGED, RUNNING, SPLIT, plan_dir, publish, seed_record

OnPlanEvent = Callable[[dict[str, Any]], None]


class PlanState(TypedDict):
    record: PlanRecord


def worktrees_dir(repo: Path, plan_id: str) -> Path:
    """Where a plan's worktrees live: beside the repo (``CHOIR_WORKTREES`` overrides), never
    inside the user's checkout, and never under CHOIR_HOME, which sandboxes hide."""
    root = os.environ.get("CHOIR_WORKTREES")
    base = Path(root) if root else repo.parent / f".{repo.name}.choir-plans"
    return base / plan_id


def plan_thread(plan_id: str) -> str:
    """The plan's checkpoint thread (and lease name): never a run id."""
    from choir.graph.checkpoints import PLAN_THREAD

    return f"{PLAN_THREAD}{plan_id}"


class Driver(Moves):
    def __init__(self, plan: Plan, on_event: OnPlanEvent | None = None,
                 plan_file: Path | None = None) -> None:
        self.plan = plan
        self.plan_file = plan_file
        self.repo = Path(plan.repo)
        self.dir = plan_dir(plan.id)  # the record, under CHOIR_HOME
        self.trees = worktrees_dir(self.repo, plan.id)  # outside CHOIR_HOME and the checkout
        self.emit = on_event or (lambda event: None)
        found = locate(self.repo)
        if found is None:
            raise UserError(f"plan {plan.id}: {self.repo} is not a git repository\n  fix: "
                            "`repo:` names the work tree of the repo the plan changes")
        self.git: GitRepo = found
        self.queue = MergeQueue(plan.id, found, self.trees, plan.integration_mood())
        self.tasks: dict[Job, asyncio.Task[Any]] = {}
        self.shown: dict[str, PlanRow] = {}

    # -- the record --------------------------------------------------------------------------
    def initial(self) -> PlanRecord:
        """A new plan's record, its integration branch made at the base."""
        base = self.git.rev(self.plan.base)
        if base is None:
            raise UserError(f"plan {self.plan.id}: base branch '{self.plan.base}' does not "
                            f"exist in {self.repo}")
        branch = integration_branch(self.plan.id)
        there = self.git.rev(f"refs/heads/{branch}")
        if there not in (None, base):  # another plan's: its landed work, its worktrees
            raise UserError(f"plan {self.plan.id}: {self.repo} has a branch {branch} at "
                            f"{there[:12]} already (a plan of this id run from another "
                            "CHOIR_HOME, or one whose record is gone); a new plan would "
                            "reset it\n  fix: give the plan a new id, or delete that branch "
                            "if nothing needs it")
        self.git.write("branch", "-f", branch, base)
        return PlanRecord(
            plan=self.plan.id, plan_file=str(self.plan_file or ""), repo=str(self.repo),
            base=base, integration=base, started=time.time(),
            items={i.id: PlanRow(member=i.member or "", goal=i.goal[:300],
                                 depends_on=i.depends_on) for i in self.plan.items})

    def adopt(self, record: PlanRecord) -> PlanRecord:
        """A record continued after a crash: the integration branch is where the record
        says, or at the head its first queue entry is landing (a move the record does not
        hold yet, recognised when that entry lands); anything else is reset to the recorded
        head, so no unverified merge stays on the branch."""
        branch = integration_branch(self.plan.id)
        at = self.git.rev(branch)
        landing = record.queue[0].head if record.queue else ""
        if at not in (record.integration, landing or None):
            refuse_checked_out(self.git, self.plan.id)
            self.git.write("update-ref", f"refs/heads/{branch}", record.integration)
        self.dir.mkdir(parents=True, exist_ok=True)
        return record

    def _publish(self, record: PlanRecord) -> None:
        publish(record)
        for item_id, row in record.items.items():
            if self.shown.get(item_id) != row:
                self.shown[item_id] = row
                self.emit({"item": item_id, **row.model_dump(mode="json")})

    # -- the graph ---------------------------------------------------------------------------
    def graph(self) -> Any:
        from langgraph.graph import START, StateGraph

        graph = StateGraph(PlanState)
        graph.add_node("step", self.step)
        graph.add_node("finish", self.finish)
        graph.add_edge(START, "step")
        return graph

    async def step(self, state: PlanState) -> Any:
        from langgraph.types import Command

        record = state["record"]
        self._publish(record)
        self._start_tasks(record)
        moved = self.advance(record)
        if moved == record:
            if not self.tasks:
                return Command(goto="finish")
            done, _ = await asyncio.wait(self.tasks.values(),
                                         return_when=asyncio.FIRST_COMPLETED)
            for job, task in list(self.tasks.items()):
                if task in done:
                    del self.tasks[job]
                    moved = self.apply(moved, job, task)
            moved = self.advance(moved)
        return Command(goto="step", update={"record": moved})

    async def finish(self, state: PlanState) -> dict[str, Any]:
        record = state["record"]
        merged = all(r.state == MERGED for r in record.items.values())
        tree = record.integration_tree
        gate = check_gate(self.plan.id, tree=tree, commit=None) if tree else None
        record = record.model_copy(update={
            "status": "asserted" if merged and gate and gate.passed else "failed"})
        self._clean_up(record)
        self._publish(record)
        return {"record": record}

    def _clean_up(self, record: PlanRecord) -> None:
        """The plan's worktrees and scratch branches, once it ended: each overlay unmounted
        and its folder removed (``drop_worktree``), then forgotten by one ``worktree prune``,
        not one git call each; what cannot be removed so is left to ``git worktree remove
        --force``. The queue's branches go in one call; the items' branches stay."""
        for path in [*(self.trees / "items").glob("*/tree"), self.trees / "integration",
                     *(self.trees / "queue").glob("*"), *(self.trees / "whole").glob("*")]:
            drop_worktree(self.git, path)  # integration: an earlier Choir's plain worktree
            if path.exists():
                self.git.write("worktree", "remove", "--force", str(path), check=False)
        shutil.rmtree(self.trees / "items", ignore_errors=True)  # the folders around them
        self.git.write("worktree", "prune", check=False)
        scratch = [ref_name(self.plan.id, "queue", item_id) for item_id in record.items]
        scratch += [ref_name(self.plan.id, "whole", i) for i, r in record.items.items()
                    if r.whole_head]
        self.git.write("branch", "-D", *scratch, check=False)  # the missing ones: skipped

    # -- work in flight ----------------------------------------------------------------------
    def _spawn(self, job: Job, work: Callable[[], Coroutine[Any, Any, Any]],
               worktree: Path) -> None:
        """A task outside the graph's context: an item's own run is a graph of its own, never
        a subgraph of the plan's (LangGraph reads a parent's config from the context).

        Its ``worktree`` is looked up first: one made before a crash is an overlay mount that
        died with the process that made it, and is mounted again (a no-op when mounted)."""
        if job not in self.tasks:
            self.git.worktree_at(worktree)
            self.tasks[job] = asyncio.create_task(work(), context=contextvars.Context())

    def _start_tasks(self, record: PlanRecord) -> None:
        """What the record says is in flight, started where this process has no task for it
        (every start after a resume; and work the previous step recorded)."""
        for item_id, row in record.items.items():
            if row.state == RUNNING:
                self._spawn(("run", item_id, str(row.attempt)),
                            functools.partial(self._run, item_id, row), self.item_tree(item_id))
            elif row.state == SPLIT and row.whole_head:
                self._spawn(("whole", item_id, row.whole_head),
                            functools.partial(self._whole, item_id, row.whole_head, record),
                            self.trees / "whole" / item_id)
        merged = [item_id for item_id, row in record.items.items() if row.state == MERGED]
        for n, entry in enumerate(record.queue):
            if entry.status == "verifying":  # its head holds the merged items and those before
                held = (*merged, *(e.item for e in record.queue[:n + 1]))
                self._spawn(("verify", entry.item, entry.head),
                            functools.partial(self.queue.verify, entry, held),
                            self.queue.worktree(entry.item))

    async def _run(self, item_id: str, row: PlanRow) -> tuple[dict[str, Any], float]:
        from choir.team.subgraph import work_item_graph
        from choir.trace.record import record_path

        clock = time.perf_counter()
        # a run that started recorded its trace first: only then is there one to continue
        started = record_path(row.run_id).exists()
        done = await work_item_graph().ainvoke({
            "work_item": str(self.item_file(item_id, row.attempt)), "run_id": row.run_id,
            "resume": started, "hand_back_splits": not row.split_of,
            "part": bool(row.split_of)})
        (outcome,) = done["outcomes"]
        return outcome, time.perf_counter() - clock

    async def _whole(self, item_id: str, head: str, record: PlanRecord) -> Verdict:
        from choir.team.queue import allowlisted, merged_verifiers, verify_tree

        path = self.trees / "whole" / item_id
        item = schedule.work_item(self.plan, record, item_id, path)
        row = record.items[item_id]
        # the item's own verifiers too, whatever its mood plans: its claim is ASSERTed here;
        # and every one that ASSERTed a part (or another item) merged into the head
        merged = [i for i, r in record.items.items() if r.state == MERGED]
        # and, as a split outside a plan is, in the mood the split climbed to, with every
        # verifier the split item's rounds ran (a lint its climb added: review 17b, F2)
        specs = [r.part for r in record.items.values()
                 if r.split_of == item_id and r.part is not None]
        # (of the allowlist: the floor holds the run's own checks too, a trace, NAME.mutants,
        # which a round of a tree never runs: review 17e)
        required = dict.fromkeys([*item.required_verifiers,
                                  *allowlisted((n for p in specs for n in p.floor), path),
                                  *merged_verifiers(self.plan.id, merged, path)])
        return await verify_tree(path, item.id, row.whole_tree, "whole", row.whole_session,
                                 mood=schedule.split_mood(item.mood, specs),
                                 required=tuple(required))


def _claims_free(plan: Plan) -> None:
    """Refuse a new plan whose claims exist already: the plan's integration rounds are its
    id's claim, each item's is ``PLAN.ITEM``, and the driver takes an ASSERT of one on a
    tree as that round done. One recorded by ``choir verify --claim`` or an agent over MCP,
    in a weaker mood or configuration, would stand in for the plan's own round.

    Raises:
        UserError: the AHDB holds claims under the plan's names.
    """
    from choir.ahdb import open_ahdb
    from choir.team.plan import item_key

    db = open_ahdb()
    taken = [name for name in (plan.id, *(item_key(plan.id, i.id) for i in plan.items))
             if db.atoms(work_item=name)]
    if taken:
        raise UserError(f"plan {plan.id}: the AHDB holds claims under its names already "
                        f"({', '.join(taken[:5])}), recorded outside this plan; a plan's "
                        f"rounds must be its own. Fix: give the plan a new id")


def _same_items(plan: Plan, plan_file: Path | None, record: PlanRecord) -> None:
    """Refuse to resume ``record`` with a plan whose items are not the ones it started with
    (a split's parts aside): an item removed has no definition to run, one added would be
    left out of a plan the gate then calls whole.

    Raises:
        UserError: the ids that differ, and the fix.
    """
    started = {item_id for item_id in record.items if "~" not in item_id}
    named = {item.id for item in plan.items}
    if started == named:
        return
    where = str(plan_file) if plan_file is not None else f"plan {plan.id}"
    said = []
    if named - started:
        said.append("names items it did not start with: " + ", ".join(sorted(named - started)))
    if started - named:
        said.append("no longer names items it started with: " +
                    ", ".join(sorted(started - named)))
    raise UserError(f"{where}: cannot resume plan {plan.id}: the plan " + "; ".join(said) +
                    "\n  fix: restore the plan's items as they were to finish it, or run the "
                    "edited plan under a new id")


async def run_plan(plan: Plan, *, resume: bool = False, plan_file: Path | None = None,
                   on_event: OnPlanEvent | None = None) -> dict[str, Any]:
    """Drive ``plan`` to its end: every item merged or failed/blocked; the record returned.

    ``resume``: continue the plan from its last checkpoint (after a crash). One process
    drives a plan at a time (the lease of ``choir run``, on the plan's thread).

    Raises:
        UserError: a second run of a plan that has a record, a resume of none, a base
            branch that does not exist, the lease held by another process.
    """
    from choir.ahdb import open_ahdb
    from choir.graph.checkpoints import open_checkpointer
    from choir.graph.lease import hold_lease

    home = choir_home()
    home.mkdir(parents=True, exist_ok=True)
    driver = Driver(plan, on_event, plan_file)
    thread = plan_thread(plan.id)
    with hold_lease(home, thread):
        async with open_checkpointer(home) as saver:
            graph = driver.graph().compile(checkpointer=saver)
            cfg: Any = {"configurable": {"thread_id": thread}, "recursion_limit": 1_000_000}
            snap = await graph.aget_state(cfg)
            start: Any = None
            if not resume:
                if snap.values or seed_record(plan.id) is not None:
                    raise UserError(f"plan {plan.id} has a record already; `choir plan run "
                                    f"--resume {plan.id}` finishes it, or give the plan a "
                                    "new id")
                _claims_free(plan)
                start = {"record": driver.initial()}
            elif not snap.values:  # recorded by an earlier Choir, before plans checkpointed
                seeded = seed_record(plan.id)
                if seeded is None:
                    raise UserError(f"no plan {plan.id} to resume")
                start = {"record": driver.adopt(seeded)}
            elif not snap.next:  # finished: its record, as published
                return dict(snap.values["record"].model_dump(mode="json"))
            else:
                driver.adopt(snap.values["record"])
            if resume:
                _same_items(plan, plan_file, (start or snap.values)["record"])
            # the plan's items in the signed log before anything merges: its gate requires
            # each, never only what the driver's record lists (review 19b)
            open_ahdb().declare_plan(plan.id, [item.id for item in plan.items])
            await graph.ainvoke(start, cfg, durability="sync")
            record = (await graph.aget_state(cfg)).values["record"]
    return dict(record.model_dump(mode="json"))
