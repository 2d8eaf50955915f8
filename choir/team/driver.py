"""The plan driver: ready items run side by side, each in its own worktree and sandbox;
ASSERTed items are merged one at a time through the gate, and the integration tree is
verified (attested, as the claim named after the plan) after every merge.

An item's worktree is made from the integration branch as it stands when the item becomes
ready, so it holds its dependencies' verified changes and nothing unverified. The user's
checkout is never touched: only refs (``choir/plan/...``) and worktrees under CHOIR_HOME.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from choir.app.gate import check_gate
from choir.app.verify import averify_tree
from choir.evidence.git import GitRepo, locate
from choir.evidence.tree import commit_tree_hash
from choir.exceptions import UserError
from choir.team.plan import Plan, item_key
from choir.team.state import (
    ASSERTED,
    BLOCKED,
    FAILED,
    MERGED,
    PENDING,
    RUNNING,
    load_state,
    plan_dir,
    save_state,
)

OnPlanEvent = Callable[[dict[str, Any]], None]
FEEDBACK_CHARS = 2000
INTEGRATION_RETRIES = 1  # a conflict or integration FAIL sends an item back once


def worktrees_dir(repo: Path, plan_id: str) -> Path:
    """Where a plan's worktrees live: beside the repo (``CHOIR_WORKTREES`` overrides), never
    inside the user's checkout, and never under CHOIR_HOME, which sandboxes hide."""
    root = os.environ.get("CHOIR_WORKTREES")
    base = Path(root) if root else repo.parent / f".{repo.name}.choir-plans"
    return base / plan_id


def integration_branch(plan_id: str) -> str:
    return f"choir/plan/{plan_id}/integration"


def item_branch(plan_id: str, item_id: str) -> str:
    return f"choir/plan/{plan_id}/item/{item_id}"


class Driver:
    def __init__(self, plan: Plan, on_event: OnPlanEvent | None = None,
                 plan_file: Path | None = None) -> None:
        self.plan = plan
        self.plan_file = plan_file
        self.repo = Path(plan.repo)
        self.dir = plan_dir(plan.id)  # the record, under CHOIR_HOME
        self.trees = worktrees_dir(self.repo, plan.id)  # outside CHOIR_HOME and the checkout
        self.emit = on_event or (lambda event: None)
        self.merging = asyncio.Lock()
        self.state: dict[str, Any] = {}
        found = locate(self.repo)
        if found is None:
            raise UserError(f"plan {plan.id}: {self.repo} is not a git repository\n  fix: "
                            "`repo:` names the work tree of the repo the plan changes")
        self.git: GitRepo = found

    # -- the record --------------------------------------------------------------------------
    def _save(self) -> None:
        save_state(self.plan.id, self.state)

    def _set(self, item_id: str, **fields: Any) -> None:
        self.state["items"][item_id].update(fields)
        self._save()
        self.emit({"item": item_id, **self.state["items"][item_id]})

    def _timed(self, item_id: str, what: str, since: float) -> None:
        """Add the seconds since ``since`` to the item's ``what`` (saved with its next
        transition): where a plan's time went, and what the driver itself cost."""
        row = self.state["items"][item_id]
        row[what] = round(row.get(what, 0.0) + time.perf_counter() - since, 3)

    def _start(self, resume: bool) -> None:
        old = load_state(self.plan.id)
        branch = integration_branch(self.plan.id)
        if resume and old is not None:
            self.state = old
        else:
            if old is not None:  # never reset a plan's integration branch by accident
                raise UserError(f"plan {self.plan.id} has a record already; `choir plan run "
                                f"--resume {self.plan.id}` finishes it, or give the plan a new "
                                "id")
            base = self.git.rev(self.plan.base)
            if base is None:
                raise UserError(f"plan {self.plan.id}: base branch '{self.plan.base}' does "
                                f"not exist in {self.repo}")
            self.git.write("branch", "-f", branch, base)
            self.state = {"plan": self.plan.id, "plan_file": str(self.plan_file or ""),
                          "repo": str(self.repo), "base": base,
                          "status": "running", "integration": base, "integration_tree": None,
                          "started": time.time(),
                          "items": {i.id: {"state": PENDING, "attempt": 0, "run_id": "",
                                           "member": i.member or "", "last": "",
                                           "feedback": "", "goal": i.goal[:300],
                                           "depends_on": list(i.depends_on)}
                                    for i in self.plan.items}}
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "items").mkdir(exist_ok=True)
        self.integration = self.git.add_worktree(self.trees / "integration", branch,
                                                 self.state["integration"])
        self._save()

    # -- one item ----------------------------------------------------------------------------
    async def _run_item(self, item_id: str) -> None:
        from choir.team.subgraph import work_item_graph

        row = self.state["items"][item_id]
        tree = self.trees / "items" / item_id
        resuming = row["state"] == RUNNING  # killed mid-run: continue that run, not a new one
        work = self.git.worktree_at(tree) if resuming else None
        if work is None:
            resuming = False
            attempt = row["attempt"] + 1
            head = self.state["integration"]
            work = self.git.add_worktree(tree, item_branch(self.plan.id, item_id), head)
            item = self.plan.work_item(item_id, tree)
            if row["feedback"]:  # bounded: the conflict or the failing verifier, once
                item = item.model_copy(update={"goal": f"{item.goal}\n\nIntegration feedback "
                                               f"(attempt {attempt}):\n{row['feedback']}"})
            path = self.dir / "items" / f"{item_id}.{attempt}.json"
            path.write_text(json.dumps(item.model_dump(mode="json",
                                                       exclude={"split_of", "focus"})))
            run_id = f"{item_key(self.plan.id, item_id)}.{attempt}"
            self._set(item_id, state=RUNNING, attempt=attempt, run_id=run_id, base=head)
        else:
            run_id, attempt = row["run_id"], row["attempt"]
            path = self.dir / "items" / f"{item_id}.{attempt}.json"
        clock = time.perf_counter()
        done = await work_item_graph().ainvoke({"work_item": str(path), "run_id": run_id,
                                                "resume": resuming})
        self._timed(item_id, "run_s", clock)
        (outcome,) = done["outcomes"]
        spent = outcome["usage"].get("total", {})
        self.state["spend"] = spend = self.state.get("spend", {})
        who = spend.setdefault(row["member"] or "(own executor)",
                               {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0})
        for key in who:  # each run counted once: the record is saved with the item's new state
            who[key] = round(who[key] + spent.get(key, 0), 6)
        if outcome["status"] != "asserted":
            self._set(item_id, state=FAILED,
                      last=f"{outcome['status']}: {outcome['reason']}"[:300])
            return
        # the git folder is the one recorded when the worktree was made, never the .git the
        # member may have rewritten; filters and hooks the config names are pinned off
        work.write("add", "-A")
        work.write("commit", "-q", "--allow-empty", "--no-verify", "-m",
                   f"{item_id}: {self.plan.item(item_id).goal[:60]}")
        commit = work.rev("HEAD") or ""
        # recorded before the merge: after a crash, an ASSERTed item is merged, never rerun
        self._set(item_id, state=ASSERTED, commit=commit, last="ASSERTed; merging")
        await self._integrate(item_id, commit)

    async def _integrate(self, item_id: str, commit: str) -> None:
        async with self.merging:
            key = item_key(self.plan.id, item_id)
            gate = check_gate(key, tree=commit_tree_hash(self.repo, commit), commit=None)
            if not gate.passed:
                self._set(item_id, state=FAILED, last="gate: " + "; ".join(gate.problems)[:300])
                return
            before = self.state["integration"]
            wt = self.integration
            merged = wt.write("merge", "--no-ff", "--no-edit", "-q", "-m", f"merge {item_id}",
                              commit, check=False)
            if merged.returncode != 0:
                conflicts = wt.write("diff", "--name-only", "--diff-filter=U", check=False)
                wt.write("merge", "--abort", check=False)
                wt.write("reset", "-q", "--hard", before)
                self._send_back(item_id, "merge conflict with the integration branch in: " +
                                (", ".join(conflicts.stdout.split()) or "(unknown files)"))
                return
            clock = time.perf_counter()
            verdict = await averify_tree(wt.root, claim=self.plan.id)
            self._timed(item_id, "integration_s", clock)
            if not verdict.passed:
                wt.write("reset", "-q", "--hard", before)
                failing = [f"{t['verifier']}: {t['result']}"
                           for t in verdict.contract.get("threads", []) if t["result"] != "PASS"]
                self._send_back(item_id, f"integration round {verdict.status}: " +
                                ("; ".join(failing) or verdict.verdict))
                return
            head = wt.rev("HEAD") or before
            tree = commit_tree_hash(self.repo, head)
            recorded = self._record_merge(key, commit, head, tree)
            if recorded is not None:  # fail closed: a merge the ledger cannot hold is undone
                wt.write("reset", "-q", "--hard", before)
                self._set(item_id, state=FAILED, last=recorded[:300])
                return
            # the integration worktree is on the integration branch: the merge moved it;
            # after a crash before this record, the resume resets it to the recorded head
            self.state["integration"] = head
            self.state["integration_tree"] = tree
            self._set(item_id, state=MERGED, last="ASSERTed; merged; integration PASS",
                      commit=commit, feedback="")

    def _record_merge(self, key: str, commit: str, head: str, tree: str | None) -> str | None:
        """The merge as an AHDB ``integrate`` event (the item's ASSERT for its tree, the
        plan's for the verified integration tree), so ``choir audit`` re-derives it; why not,
        when it cannot be written."""
        from choir.ahdb import open_ahdb
        from choir.exceptions import PromotionError

        db = open_ahdb()
        item_tree = commit_tree_hash(self.repo, commit)
        item = db.is_asserted(key, item_tree) if item_tree else None
        whole = db.is_asserted(self.plan.id, tree) if tree else None
        if item is None or whole is None or item_tree is None or tree is None:
            return "merge not recorded: no live ASSERT for the item's or the integration tree"
        try:
            db.integrate(self.plan.id, key, assert_id=item.id, tree_hash=item_tree,
                         commit=commit, head=head, integration_assert=whole.id,
                         integration_tree=tree)
        except PromotionError as exc:
            return f"merge not recorded: {exc}"
        return None

    def _send_back(self, item_id: str, feedback: str) -> None:
        row = self.state["items"][item_id]
        sent = row.get("sent_back", 0)
        if sent >= INTEGRATION_RETRIES:
            self._set(item_id, state=FAILED, last=feedback[:FEEDBACK_CHARS])
            return
        self._set(item_id, state=PENDING, sent_back=sent + 1, last=feedback[:300],
                  feedback=feedback[:FEEDBACK_CHARS])

    # -- the schedule ------------------------------------------------------------------------
    def _ready(self) -> tuple[list[str], bool]:
        """Items whose dependencies are merged, and whether blocking changed anything."""
        rows, ready, changed = self.state["items"], [], False
        for item in self.plan.items:
            if rows[item.id]["state"] not in (PENDING, RUNNING):  # RUNNING: after a crash
                continue
            deps = [rows[d]["state"] for d in item.depends_on]
            if any(s in (FAILED, BLOCKED) for s in deps):
                bad = [d for d in item.depends_on if rows[d]["state"] in (FAILED, BLOCKED)]
                self._set(item.id, state=BLOCKED, last=f"blocked by {', '.join(bad)}")
                changed = True
            elif all(s == MERGED for s in deps):
                ready.append(item.id)
        return ready, changed

    def _budget_spent(self) -> str | None:
        """Which of the plan's limits is reached (item runs, tokens, cost, wall time)."""
        limit, rows = self.plan.budget, self.state["items"].values()
        spend = self.state.get("spend", {}).values()
        used = {"attempts": sum(r["attempt"] for r in rows),
                "tokens": sum(s["prompt_tokens"] + s["completion_tokens"] for s in spend),
                "cost_usd": round(sum(s["cost_usd"] for s in spend), 6),
                "wall_s": round(time.time() - self.state["started"], 1)}
        for name, value in used.items():
            cap = getattr(limit, name)
            if cap is not None and value >= cap:
                return f"{name} {value}/{cap}"
        return None

    def _member_free(self, item_id: str, running: dict[str, Any]) -> bool:
        """Below the member's own ``concurrency`` (an item with its own executor: no limit)."""
        name = self.plan.item(item_id).member
        if name is None:
            return True
        busy = sum(1 for other in running if self.plan.item(other).member == name)
        return busy < self.plan.members[name].concurrency

    async def run(self, resume: bool = False) -> dict[str, Any]:
        self._start(resume)
        for item_id, row in self.state["items"].items():  # ASSERTed before a crash: merged
            if row["state"] == ASSERTED:
                await self._integrate(item_id, row["commit"])
        running: dict[str, asyncio.Task[None]] = {}
        while True:
            ready, changed = self._ready()
            spent = self._budget_spent() if ready else None
            for item_id in ready if spent else ():  # nothing more starts; the rest is blocked
                if item_id not in running:
                    self._set(item_id, state=BLOCKED, last=f"plan budget spent: {spent}")
                    changed = True
            for item_id in ready if not spent else ():
                if item_id not in running and len(running) < self.plan.max_parallel and \
                        self._member_free(item_id, running):
                    running[item_id] = asyncio.create_task(self._run_item(item_id))
            if not running:
                if changed:
                    continue
                break
            done, _ = await asyncio.wait(running.values(), return_when=asyncio.FIRST_COMPLETED)
            for item_id, task in list(running.items()):
                if task in done:
                    del running[item_id]
                    if task.exception() is not None:
                        exc = task.exception()
                        self._set(item_id, state=FAILED,
                                  last=f"error: {type(exc).__name__}: {exc}"[:300])
        return self._finish()

    def _finish(self) -> dict[str, Any]:
        rows = self.state["items"].values()
        merged = all(r["state"] == MERGED for r in rows)
        tree = self.state["integration_tree"]
        gate = check_gate(self.plan.id, tree=tree, commit=None) if tree else None
        self.state["status"] = "asserted" if merged and gate and gate.passed else "failed"
        self._save()
        for path in [self.integration.root, *(self.trees / "items").glob("*")]:
            if path.is_dir():
                self.git.write("worktree", "remove", "--force", str(path), check=False)
        self.git.write("worktree", "prune", check=False)
        return self.state


async def run_plan(plan: Plan, *, resume: bool = False, plan_file: Path | None = None,
                   on_event: OnPlanEvent | None = None) -> dict[str, Any]:
    """Drive ``plan`` to its end: every item merged or failed/blocked; the record returned.

    ``resume``: continue the plan's record (after a crash): merged items are not run again.
    """
    return await Driver(plan, on_event, plan_file).run(resume=resume)
