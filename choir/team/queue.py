"""The merge queue: merges serialised, their verification not.

Every ASSERTed item joins the queue. Its speculative integration head is its commit merged
onto the head of the entry before it (or onto the integration head, for the first entry):
A, then A+B, then A+B+C, each built with ``git merge-tree`` (objects only: no work tree is
ever half merged) and ``commit-tree``, each in a worktree of its own (its ``HEAD`` the head
itself, detached: no branch moved for it), and each verified by an
integration round (attested, as the claim named after the plan) side by side with the others.
An item that lands on the very head it started from, its commit's one parent, is a fast
forward instead: its head is its commit, no merge commit (``build``).
The queue lands in order: the first entry, once its round passed, moves the integration
branch to exactly the head that round verified (``update-ref`` with the old value, after the
``integrate`` event is written). When an entry's round fails, its item goes back for revision
and every entry after it is rebuilt without it (A+B becomes B alone) and verified again: a
head that holds a failed item is never landed, and no event names a tree no round verified.

Recorded before it is verified: a head is in the checkpointed record before its round
starts, so after kill -9 the round runs again on exactly that head (or the head's live
ASSERT, from the round that finished before the kill, is reused: it is for exactly that
tree). Landing is idempotent: an ``integrate`` event already written and a branch already
moved are recognised, never repeated.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from choir._core import fsopen
from choir._core.failpoints import failpoint
from choir._core.ids import new_run_id
from choir.ahdb import open_ahdb
from choir.app.gate import check_gate
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.git import GitRepo
from choir.evidence.tree import commit_record, commit_tree_hash
from choir.evidence.worktrees import drop_worktree
from choir.exceptions import PromotionError, UserError
from choir.models import Mood
from choir.models.plan import QueueEntry
from choir.team.plan import item_key

FEEDBACK_CHARS = 2000


def bounded(text: str, limit: int = FEEDBACK_CHARS) -> str:
    """``text`` in at most ``limit`` characters, saying how much was cut when it was: a
    member told part of a conflict or a failing round must know there is more."""
    if len(text) <= limit:
        return text
    mark = f" [... {len(text)} characters in all, the rest cut]"
    return text[:max(0, limit - len(mark))] + mark


def integration_branch(plan_id: str) -> str:
    return f"choir/plan/{plan_id}/integration"


def ref_name(plan_id: str, kind: str, item_id: str) -> str:
    """A branch of the plan's: ``item``, ``queue`` or ``whole``; a part's (its id holds a
    ``~``, which git refuses) under ``KIND-part`` with ``~`` as ``-``, never a plan item's."""
    if "~" in item_id:
        return f"choir/plan/{plan_id}/{kind}-part/{item_id.replace('~', '-')}"
    return f"choir/plan/{plan_id}/{kind}/{item_id}"


@dataclass(frozen=True)
class Verdict:
    """An integration round's outcome for one head (runtime only: the record keeps the
    entry's status and bounded verdict)."""

    passed: bool
    verdict: str
    seconds: float


async def verify_tree(path: Path, claim: str, tree: str, what: str, session: str,
                      mood: Mood | None = None, required: tuple[str, ...] = ()) -> Verdict:
    """A round on the worktree at ``path`` recorded as ``claim``, as session ``session``
    (recorded before the round started); it must read exactly ``tree``.

    After a crash the same session runs again: its sealed verifier runs are reused, the ones
    cut short set aside, so no half-made run is left for ``choir audit`` to find. A live
    ASSERT of ``claim`` for exactly that tree (a round that passed before the crash, or a
    merge that changed nothing) is that round already when a PASS of every ``required``
    verifier stands behind it (review 19b: an item that changed nothing reused a round its
    required verifier never ran in); a session that recorded a FAIL is that
    FAIL; one recorded complete without its claim is followed by a fresh session.
    """
    from choir.app.verify import averify_tree

    clock = time.perf_counter()
    db = open_ahdb()
    before = db.is_asserted(claim, tree)
    if before is not None and set(required) <= db.verified_by(before):
        return Verdict(True, f"{what} PASS (this tree was verified before)", 0.0)
    record = ArtifactStore().run_dir(session) / "manifest.json"
    if record.exists():
        if _recorded_status(record) == "FAIL":
            return Verdict(False, f"{what} round FAIL (session {session})", 0.0)
        session = new_run_id("verify")
    outcome = await averify_tree(path, claim=claim, mood=mood, session=session,
                                 required=required, plan_item=True)
    seconds = time.perf_counter() - clock
    seen = outcome.contract.get("manifest", {}).get("tree_hash")
    if seen != tree:  # fail closed: the round must have read exactly that head
        return Verdict(False, f"{what} round read tree {str(seen)[:12]}, not the head's "
                       f"{tree[:12]}", seconds)
    if outcome.passed:
        return Verdict(True, f"{what} PASS", seconds)
    failing = [f"{t['verifier']}: {t['result']}"
               for t in outcome.contract.get("threads", []) if t["result"] != "PASS"]
    return Verdict(False, f"{what} round {outcome.status}: " +
                   ("; ".join(failing) or outcome.verdict), seconds)


def merged_verifiers(plan_id: str, items: Iterable[str], head: Path) -> tuple[str, ...]:
    """Every verifier of the allowlist at ``head`` whose PASS ASSERTed one of ``items`` (plan
    item ids): a head that holds their changes is checked by each, so two changes are
    checked together by every verifier that checked either (review 16d: an item's required
    lint, or one its mood climb added, never ran on the head where another item broke it).
    Choir's own run checks behind an item's ASSERT (its trace verifier, a mutation check's
    ``NAME.mutants``) are a ``choir run``'s, not the allowlist's, and a round of a tree runs
    only the allowlist (a second review: every PARANOID item failed its integration round)."""
    db = open_ahdb()
    found = set().union(*(db.asserted_by(item_key(plan_id, item)) for item in items))
    return allowlisted(found, head)


def allowlisted(names: Iterable[str], head: Path) -> tuple[str, ...]:
    """``names`` that the allowlist at ``head`` holds (Choir's own run checks left out)."""
    from choir.config import load_repo_config

    names = set(names)
    allowlist = load_repo_config(head).verifiers if names else {}
    return tuple(sorted(name for name in names if name in allowlist))


def _recorded_status(path: Path) -> str:
    """A session record's status ("" when it cannot be read: then it decides nothing)."""
    try:
        data = json.loads(fsopen.read_bytes(path.parent, path.name, 4 << 20))
    except (OSError, ValueError):
        return ""
    return str(data.get("status", "")) if isinstance(data, dict) else ""


def refuse_checked_out(git: GitRepo, plan_id: str) -> None:
    """Refuse to move the integration branch while a person has it checked out: the plan
    never touches a checkout before promotion, and moving the branch under one would.

    Raises:
        UserError: it is checked out (the plan stops; ``--resume`` once it is not).
    """
    branch = integration_branch(plan_id)
    users = git.checked_out(branch)
    if users:
        raise UserError(f"{branch} is checked out in {users[0]}: the plan moves it as items "
                        "land, and never moves a checkout\n  fix: switch that checkout to "
                        f"another branch, then `choir plan run --resume` the plan")


@dataclass(frozen=True)
class MergeQueue:
    plan_id: str
    git: GitRepo  # the plan's repository: objects and refs only, its checkout untouched
    trees: Path  # where the heads' worktrees go
    mood: Mood = Mood.CALM  # of every integration round (``Plan.integration_mood``)

    def worktree(self, item_id: str) -> Path:
        return self.trees / "queue" / item_id

    def build(self, entry: QueueEntry, onto: str, start: str = "") -> QueueEntry | str:
        """``entry`` merged onto ``onto``: the entry with its head, tree and worktree made,
        or why not as bounded feedback (a conflict, or a merge git refuses: nothing written
        but unreferenced objects).

        When ``onto`` is ``start``, the commit the item's worktree was made from, and the
        item's commit has exactly that one parent (the member made no commit of its own),
        the merge is a fast forward: the head is the item's commit, with no merge commit.
        Its round still reads a worktree of its own made from the commit: never the item's,
        where the member may have left files git ignores (a ``.venv`` the round would run,
        a resource folder) that no tree hash covers."""
        if start and onto == start:
            found = commit_record(self.git.root, entry.commit)
            if found is not None and found[1] == (onto,):
                self.git.add_worktree(self.worktree(entry.item), None, entry.commit)
                failpoint("plan:built")
                return self._built(entry, onto, entry.commit, found[0])
        merged = self.git.write("merge-tree", "--write-tree", "--name-only", "--no-messages",
                                onto, entry.commit, check=False)
        lines = merged.stdout.split("\n")
        if merged.returncode == 1:
            files = [name for name in lines[1:] if name]
            return bounded("merge conflict with the integration branch in: " +
                           (", ".join(dict.fromkeys(files)) or "(unknown files)"))
        if merged.returncode != 0:  # unrelated histories, a commit git cannot read: the
            # item's own doing (a member can write its branch), so the item goes back, and
            # the rest of the plan goes on
            return bounded(f"git refused to merge it onto the integration branch: "
                           f"{merged.stderr.strip()[-300:]}")
        head = self.git.write("commit-tree", lines[0].strip(), "-p", onto, "-p",
                              entry.commit, "-m", f"merge {entry.item}").stdout.strip()
        self.git.add_worktree(self.worktree(entry.item), None, head)
        tree = commit_tree_hash(self.git.root, head)
        if tree is None:
            raise UserError(f"the merge of {entry.item} ({head[:12]}) cannot be read back")
        failpoint("plan:built")
        return self._built(entry, onto, head, tree)

    @staticmethod
    def _built(entry: QueueEntry, onto: str, head: str, tree: str) -> QueueEntry:
        return entry.model_copy(update={"base": onto, "head": head, "tree": tree,
                                        "session": new_run_id("verify"),
                                        "status": "verifying", "verdict": ""})

    async def verify(self, entry: QueueEntry, items: tuple[str, ...] = ()) -> Verdict:
        """The integration round of ``entry``'s head, as the claim named after the plan, in
        the plan's integration mood, with every verifier that ASSERTed one of ``items`` (the
        plan items merged into the head: ``merged_verifiers``) whatever the mood plans."""
        path = self.worktree(entry.item)
        return await verify_tree(path, self.plan_id, entry.tree, "integration",
                                 entry.session, mood=self.mood,
                                 required=merged_verifiers(self.plan_id, items, path))

    def land(self, entry: QueueEntry, current: str) -> str | None:
        """Move the integration branch from ``current`` to ``entry``'s verified head, after
        its ``integrate`` event; why not, when the gate or the ledger refuses it."""
        refuse_checked_out(self.git, self.plan_id)
        key = item_key(self.plan_id, entry.item)
        item_tree = commit_tree_hash(self.git.root, entry.commit)
        gate = check_gate(key, tree=item_tree, commit=None) if item_tree else None
        if gate is None or not gate.passed:
            problems = gate.problems if gate else ["its commit cannot be read back"]
            return "gate: " + "; ".join(problems)
        db = open_ahdb()
        item = db.is_asserted(key, item_tree)
        whole = db.is_asserted(self.plan_id, entry.tree)
        if item is None or whole is None or item_tree is None:
            return "merge not recorded: no live ASSERT for the item's or the integration tree"
        if not db.integrated(self.plan_id, key, entry.head):
            try:
                db.integrate(self.plan_id, key, assert_id=item.id, tree_hash=item_tree,
                             commit=entry.commit, head=entry.head,
                             integration_assert=whole.id, integration_tree=entry.tree)
            except PromotionError as exc:
                return f"merge not recorded: {exc}"
        failpoint("plan:integrated")
        branch = f"refs/heads/{integration_branch(self.plan_id)}"
        moved = self.git.write("update-ref", branch, entry.head, current, check=False)
        if moved.returncode and self.git.rev(branch) != entry.head:  # not moved before a crash
            raise UserError(f"the integration branch is neither at {current[:12]} nor at "
                            f"{entry.head[:12]}: {moved.stderr.strip()[-300:]}")
        failpoint("plan:landed")
        return None

    def record_whole(self, item_id: str, head: str, tree: str) -> str | None:
        """A split item, checked whole on the integration head its parts were merged into:
        its ``integrate`` event names that head (already on the branch, nothing moves)."""
        key = item_key(self.plan_id, item_id)
        db = open_ahdb()
        item = db.is_asserted(key, tree)
        whole = db.is_asserted(self.plan_id, tree)
        if item is None or whole is None:
            return "not recorded: no live ASSERT for the item or the plan on that tree"
        if not db.integrated(self.plan_id, key, head):
            try:
                db.integrate(self.plan_id, key, assert_id=item.id, tree_hash=tree,
                             commit=head, head=head, integration_assert=whole.id,
                             integration_tree=tree)
            except PromotionError as exc:
                return f"not recorded: {exc}"
        return None

    def drop(self, item_id: str) -> None:
        """An entry's worktree, once it landed or was set aside: removed, with git's record
        of it, without a git process (``drop_worktree``: the driver made it from git's
        objects, and nothing else writes there); the queue's branches go at the plan's end."""
        drop_worktree(self.git, self.worktree(item_id))
