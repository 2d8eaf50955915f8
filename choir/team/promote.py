"""The plan's gate and its promotion: no promotion, no global effect.

The plan is ASSERTed only when its record says every item merged, each item's merged commit
still passes the gate for exactly its tree, and the final integration tree passes the gate
for the claim named after the plan. ``promote`` moves a branch to the integration commit only
then, only for exactly that tree, and only as a fast forward.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from choir._core.failpoints import failpoint
from choir.ahdb import open_ahdb
from choir.ahdb.anchor import PinnedHead, SeenHeads
from choir.ahdb.signed import read_signed
from choir.app.gate import GateAnswer, bound_commit, check_gate
from choir.attest import trust_root
from choir.evidence.git import GitRepo, locate
from choir.evidence.tree import commit_tree_hash
from choir.exceptions import PromotionError, UserError
from choir.team.plan import item_key
from choir.team.queue import integration_branch
from choir.team.state import MERGED, load_state, save_state


def is_plan(plan_id: str) -> bool:
    """Whether ``plan_id`` names a plan: its record, and its merges in the AHDB's log. The
    record alone is a file anyone who can write the home can plant (review 16e: one naming
    an old tree of a ``choir verify --claim`` made ``choir gate NAME`` answer for that tree,
    not the current directory's)."""
    return load_state(plan_id) is not None and bool(open_ahdb().merges(plan_id))


def check_plan_gate(plan_id: str, tree: str | None = None, *, pin: PinnedHead | None = None,
                    pin_source: str = "the pinned head", seen: SeenHeads | None = None,
                    commit: str | None = None) -> GateAnswer:
    """The gate for a plan: its integration tree (or ``tree``) and every item's commit.

    ``commit``: a commit the tree hash does not cover whole (it holds submodule entries,
    ``choir.app.gate.gate_target``): it passes only as a head the plan itself landed on its
    final tree (review 19b: the final tree plus a gitlink opened a plan's gate).

    The final integration tree is the one the plan's last merge in the log names, never the
    driver's record's word alone; ``pin`` and ``seen`` are the rollback anchors, as for any
    gate (review 16e: a plan's gate, and ``promote``, opened on a home rolled back to before
    a FAIL had demoted the plan's ASSERT)."""
    state = load_state(plan_id)
    merges = open_ahdb().merges(plan_id)
    # every tree an integration round verified and a merge landed (a split item's whole
    # check names the head it began on, which later landings may have passed: the last
    # event is not always the final tree); the record says which is final, and must name one
    landed = {str(m.get("integration_tree") or "") for m in merges}
    final = str((state or {}).get("integration_tree") or "")
    tree = tree or final or None
    # a plan's rounds are its own: a claim's hint (`choir verify --claim`, which refuses a
    # plan's id) is not what opens its gate (review 17h)
    answer = check_gate(plan_id, tree=tree, commit=None, pin=pin, pin_source=pin_source,
                        seen=seen, opens=f"`choir plan run` of plan {plan_id} ending asserted "
                                         "on that tree") if tree else GateAnswer(
        False, plan_id, None, None, problems=["the plan has no verified integration tree"])
    answer.recorded_by = "choir plan run" if answer.recorded_by else answer.recorded_by
    if state is None:
        answer.passed = False
        answer.problems.append(f"no plan {plan_id} on record")
        return answer
    if not merges:
        answer.problems.append(f"the AHDB's log holds no merge of plan {plan_id}")
    if state.get("status") != "asserted":
        answer.problems.append(f"plan {plan_id} is {state.get('status')}, not asserted")
    if tree != final or final not in landed:
        answer.problems.append("the tree is not the plan's final integration tree (one a "
                               "merge of the plan in the log names)")
    if commit is not None and commit not in {str(m.get("head")) for m in merges
                                             if m.get("integration_tree") == final}:
        answer.problems.append(f"commit {commit[:12]} holds submodule entries, which no tree "
                               "hash covers, and is not a head the plan landed on its final "
                               "tree")
    merged = {str(m.get("item")): str(m.get("tree_hash")) for m in merges}
    declared = open_ahdb().plan_items(plan_id)
    if declared is None:
        answer.problems.append(f"the AHDB's log does not say which items plan {plan_id} has "
                               "(a plan recorded before Choir wrote it): run the plan again "
                               "under a new id")
    for item_id in sorted(declared or ()):  # the log's list, not the record's (review 19b)
        if item_key(plan_id, item_id) not in merged:
            answer.problems.append(f"item {item_id}: no merge of it in the AHDB's log")
        if item_id not in state["items"]:
            answer.problems.append(f"item {item_id}: missing from the plan's record")
    repo = Path(state["repo"])
    for item_id, row in state["items"].items():
        if row["state"] != MERGED:
            answer.problems.append(f"item {item_id} is {row['state']}")
            continue
        item_tree = commit_tree_hash(repo, row["commit"])
        key = item_key(plan_id, item_id)
        if merged.get(key) != item_tree:
            answer.problems.append(f"item {item_id}: its commit's tree is not the one its "
                                   "merge in the log names")
        sub = check_gate(key, tree=item_tree, commit=None, pin=pin, pin_source=pin_source,
                         seen=seen)
        answer.problems.extend(f"item {item_id}: {p}" for p in sub.problems)
    answer.passed = answer.passed and not answer.problems
    answer.recorded_by = "choir plan run"  # its integration rounds' claim, and its items' runs
    return answer


def promote(plan_id: str, to: str, repo: Path | None = None, *,
            pin: PinnedHead | None = None, pin_source: str = "the pinned head") -> str:
    """Fast-forward ``to`` to the plan's integration commit; the commit promoted. The gate
    is checked with the rollback anchors: ``pin`` (``--expect-head``) and this machine's
    high-water marks (``SeenHeads.default_path()``).

    Raises:
        UserError: refused, with the reason (the gate, a changed tree, not a fast forward,
            a branch checked out).
    """
    state = load_state(plan_id)
    if state is None:
        raise UserError(f"promote: no plan {plan_id} on record")
    repo = (repo or Path(state["repo"])).resolve()
    git = locate(repo)
    if git is None:
        raise UserError(f"promote: {repo} is not a git repository")
    _check_target(git, to)
    head = git.rev(integration_branch(plan_id))
    if head is None:
        raise UserError(f"promote: {repo} has no branch {integration_branch(plan_id)}")
    if head != state.get("integration"):  # the branch is a ref anyone with the repo moves
        raise UserError(f"promote: refused: {integration_branch(plan_id)} is at {head[:12]}, "
                        f"not at the commit the plan landed and verified "
                        f"({str(state.get('integration'))[:12]}): a commit nobody verified "
                        "may hold history or submodule entries no tree hash covers")
    tree = commit_tree_hash(repo, head)
    if tree is None:  # never the recorded tree in its place: that would gate another tree
        raise UserError(f"promote: refused: the tree of {head[:12]} cannot be read")
    try:  # the bytes a checkout of the branch holds are the bytes verified (review 19b)
        bound_commit(repo, head)
    except UserError as exc:
        raise UserError("promote: refused: " + str(exc).removeprefix("gate: ")) from None
    marks = SeenHeads.default_path()
    answer = check_plan_gate(plan_id, tree=tree, pin=pin, pin_source=pin_source,
                             seen=SeenHeads(marks) if marks else None)
    if not answer.passed:
        raise UserError(f"promote: refused: the gate does not hold for {head[:12]}:\n  " +
                        "\n  ".join(answer.problems))
    old = git.rev(f"refs/heads/{to}")  # the branch: never a tag of that name (review 16c:
    # `--to vA` read the tag, then moved refs/heads/vA from it, and failed every time)
    if old is not None and git.run("merge-base", "--is-ancestor", old, head) is None:
        raise UserError(f"promote: refused: {to} is not an ancestor of {head[:12]} (not a fast "
                        "forward)")
    listed = (git.run("worktree", "list", "--porcelain") or b"").decode("utf-8", "replace")
    if f"branch refs/heads/{to}" in listed.splitlines():
        raise UserError(f"promote: refused: {to} is checked out in a work tree of {repo}; "
                        "switch it to another branch first (promotion never touches a "
                        "checkout)")
    if old == head and any(p.get("to") == to and p.get("commit") == head
                           for p in state.get("promotions", [])):
        return head  # promoted before (its event and its move both done): nothing to do
    # the event first, then the branch: a kill between them leaves an event whose branch has
    # not moved (the next promote moves it, without a second event), never a branch moved
    # with no event (no global effect without one)
    _record(plan_id, state, head, tree, to, old)
    failpoint("plan:released")
    moved = git.write("update-ref", "--no-deref", f"refs/heads/{to}", head, old or "",
                      check=False)
    if moved.returncode and git.rev(to) != head:
        raise UserError(f"promote: {to} moved while it was promoted (from {str(old)[:12]}); "
                        "its release is recorded: run promote again to move it")
    state.setdefault("promotions", []).append(
        {"to": to, "commit": head, "tree": tree, "from": old,
         "at": dt.datetime.now(dt.UTC).isoformat()})
    save_state(plan_id, state)
    return head


def _check_target(git: GitRepo, to: str) -> None:
    """Refuse a ``--to`` that is not a plain branch name Choir may move: git's own rules
    (``check-ref-format``), never an option, ``HEAD``, a full ``refs/`` name or a plan's own
    branch, and never a symbolic ref (``update-ref`` would move the branch it names, which
    may be checked out, while the check above looked for this name).

    Raises:
        UserError: the name, and the fix.
    """
    fix = "\n  fix: give a branch name such as `release` or `main`"
    if to.startswith("-") or to in ("HEAD", "@") or to.startswith(("refs/", "choir/plan/")) \
            or git.run("check-ref-format", f"refs/heads/{to}") is None:
        raise UserError(f"promote: refused: --to {to!r} is not a branch name Choir moves "
                        f"(an option, HEAD, a full ref, a plan's own branch, or a name git "
                        f"refuses){fix}")
    if git.run("symbolic-ref", "-q", f"refs/heads/{to}") is not None:
        raise UserError(f"promote: refused: {to} is a symbolic ref (moving it would move the "
                        f"branch it names){fix}")


def _record(plan_id: str, state: dict[str, Any], head: str, tree: str, to: str,
            old: str | None) -> None:
    """The promotion as an AHDB event, on the plan's and every item's live ASSERT.

    The ASSERTs are found in the signed log (``choir.ahdb.signed``), not the store's
    tables, and the event must pass the rules against that state too: an edited table
    moves no branch.

    Raises:
        PromotionError: the rules refuse it (an ASSERT gone or demoted since the gate), or
            the log has events no trusted key signed.
    """
    db = open_ahdb()
    signed = read_signed(db, trust_root().keys)
    if signed.problems:
        raise PromotionError("promote: " + "; ".join(signed.problems))
    plan_assert = signed.asserted(plan_id, tree)
    if plan_assert is None:
        raise PromotionError(f"promote: plan {plan_id} has no live ASSERT for {tree[:12]}")
    repo = Path(state["repo"])
    items: dict[str, str] = {}
    for item_id, row in state["items"].items():
        key = item_key(plan_id, item_id)
        found = signed.asserted(key, commit_tree_hash(repo, row["commit"]))
        if found is None:
            raise PromotionError(f"promote: item {item_id} has no live ASSERT")
        items[key] = found.id
    if not db.released(plan_id, commit=head, branch=to, previous=old):
        db.release(plan_id, assert_id=plan_assert.id, tree_hash=tree, commit=head, branch=to,
                   previous=old, items=items, against=signed.state)
