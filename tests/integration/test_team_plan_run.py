"""Plans run for real: worktrees, bwrap sandboxes, pytest verifiers, merges through the gate.

Each test's executors are scripted ``command``s, so every outcome is known in advance.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from choir.team.driver import run_plan
from choir.team.plan import load_plan
from tests.team import git, team_repo, write_plan
from tests.workitems import JUNIT, PYTEST

# whole runs (plans of several items; spec changes under every mood): CI's slow stage runs
# them, so that the README's command stays under five minutes
pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
              pytest.mark.slow]


def drive(tmp_path: Path, items: str, plan_id: str = "p") -> dict:
    repo = team_repo(tmp_path / "repo")
    before = (git(repo, "status", "--porcelain"), git(repo, "rev-parse", "HEAD"))
    state = asyncio.run(run_plan(load_plan(write_plan(tmp_path, plan_id, items))))
    # the user's checkout: no file, no index change, still on the base commit
    assert (git(repo, "status", "--porcelain"), git(repo, "rev-parse", "HEAD")) == before
    return state


def one_attempt(plan: Path) -> None:
    """``plan`` with a plan-wide budget of one item run."""
    plan.write_text(plan.read_text() + "budget: {attempts: 1}\n")


def show(repo: Path, ref: str, name: str) -> str:
    return git(repo, "show", f"{ref}:{name}")


def test_independent_and_dependent_items_merge_into_a_verified_integration(
        tmp_path: Path) -> None:
    state = drive(tmp_path, """\
        - id: a
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        - id: z
          goal: write z
          member: worker
        - id: b
          goal: copy a into b
          executor: {kind: command, command: 'cp a.txt b.txt || echo missing > b.txt'}
          depends_on: [a]
        """)
    rows = state["items"]
    assert {k: r["state"] for k, r in rows.items()} == dict.fromkeys("azb", "merged"), rows
    assert state["status"] == "asserted"
    assert set(state["spend"]) == {"worker", "(own executor)"}  # tokens and cost per member
    repo = tmp_path / "repo"
    assert show(repo, "choir/plan/p/integration", "b.txt") == "A"  # b saw a's verified change
    assert git(repo, "rev-parse", "choir/plan/p/integration") == state["integration"]


def test_conflicting_items_one_is_sent_back_and_rebased(tmp_path: Path) -> None:
    state = drive(tmp_path, """\
        - id: one
          goal: c is one
          executor: {kind: command, command: 'echo one > c.txt'}
        - id: two
          goal: c is two
          executor: {kind: command, command: 'echo two > c.txt'}
        """)
    rows = state["items"]
    assert rows["one"]["state"] == rows["two"]["state"] == "merged", rows
    back = [r for r in rows.values() if r.get("sent_back")]
    assert len(back) == 1 and back[0]["attempt"] == 2
    assert state["status"] == "asserted"


def test_two_items_that_break_together_are_caught_by_the_integration_round(
        tmp_path: Path) -> None:
    state = drive(tmp_path, """\
        - id: x
          goal: flag x
          max_attempts: 1
          executor: {kind: command, command: 'touch x.flag'}
        - id: y
          goal: flag y
          max_attempts: 1
          executor: {kind: command, command: 'touch y.flag'}
        """)
    rows = state["items"]
    assert sorted(r["state"] for r in rows.values()) == ["failed", "merged"], rows
    loser = next(r for r in rows.values() if r["state"] == "failed")
    assert loser["sent_back"] == 1
    assert state["status"] == "failed"
    repo = tmp_path / "repo"
    files = git(repo, "ls-tree", "--name-only", "choir/plan/p/integration").split()
    assert not ("x.flag" in files and "y.flag" in files)  # nothing left half-merged


def test_a_halted_item_blocks_its_dependents_and_the_rest_goes_on(tmp_path: Path) -> None:
    state = drive(tmp_path, """\
        - id: bad
          goal: breaks the tree
          max_attempts: 1
          executor: {kind: command, command: 'echo BROKEN > h.txt'}
        - id: after
          goal: needs bad
          member: worker
          depends_on: [bad]
        - id: ok
          goal: fine
          executor: {kind: command, command: 'echo A > a.txt'}
        """)
    rows = state["items"]
    assert rows["bad"]["state"] == "failed"
    assert rows["after"]["state"] == "blocked" and "bad" in rows["after"]["last"]
    assert rows["ok"]["state"] == "merged"
    assert rows["after"]["attempt"] == 0  # never started


def test_a_stuck_item_escalates_to_a_stronger_member_within_its_one_budget(
        tmp_path: Path) -> None:
    """The same failure that does not divide halts; with ``escalate_to: MEMBER`` the item
    goes to that member for the attempts left, and its verified change is merged."""
    repo = team_repo(tmp_path / "repo")
    plan = tmp_path / "plan.yaml"
    plan.write_text("""\
id: esc
repo: ./repo
base: main
members:
  weak: {executor: {kind: command, command: 'echo BROKEN > a.txt'}}
  strong: {executor: {kind: command, command: 'echo A > a.txt'}}
items:
  - id: a
    goal: write a
    member: weak
    max_attempts: 6
    escalate_to: strong
""")
    state = asyncio.run(run_plan(load_plan(plan)))
    row = state["items"]["a"]
    assert row["state"] == "merged", row
    assert show(repo, "choir/plan/esc/integration", "a.txt") == "A"


def test_the_plan_wide_budget_stops_new_items_and_reports_the_rest_blocked(
        tmp_path: Path) -> None:
    repo = team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "bud", """\
        - id: first
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        - id: second
          goal: write c
          executor: {kind: command, command: 'echo C > c.txt'}
        - id: third
          goal: after second
          member: worker
          depends_on: [second]
        """, max_parallel=1)
    one_attempt(plan)
    state = asyncio.run(run_plan(load_plan(plan)))
    rows = state["items"]
    assert rows["first"]["state"] == "merged", rows
    assert rows["second"]["state"] == "blocked" and rows["second"]["attempt"] == 0
    assert "plan budget spent: attempts 1/1" in rows["second"]["last"]
    assert rows["third"]["state"] == "blocked" and "second" in rows["third"]["last"]
    assert state["status"] == "failed"
    assert git(repo, "ls-tree", "--name-only", "choir/plan/bud/integration").count("c.txt") == 0


def test_an_item_that_changes_nothing_merges_onto_a_tree_verified_before(
        tmp_path: Path) -> None:
    """The merge leaves the integration tree as it was, under a new merge commit: its
    ASSERT (from the earlier round) binds it by tree, as the gate does, and is recorded."""
    from choir.ahdb import open_ahdb

    state = drive(tmp_path, """\
        - id: a
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        - id: z
          goal: nothing to do
          member: worker
          depends_on: [a]
        """)
    rows = state["items"]
    assert rows["a"]["state"] == rows["z"]["state"] == "merged", rows
    merges = [e.payload["item"] for e in open_ahdb().events() if e.kind == "integrate"]
    assert merges == ["p.a", "p.z"]


def _flags_repo(tmp_path: Path, kind: str) -> Path:
    """A repo whose ``unit`` verifier always passes and whose ``integ`` verifier (of
    ``kind``) fails when ``x.flag`` and ``y.flag`` are both there."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "test_unit.py").write_text("def test_ok():\n    assert True\n")
    (repo / "test_integ.py").write_text(
        "import pathlib\n\ndef test_together():\n    here = pathlib.Path('.')\n"
        "    assert not ((here / 'x.flag').exists() and (here / 'y.flag').exists())\n")
    (repo / "choir.yaml").write_text(
        "verifiers:\n"
        f"  unit: {{kind: unit_tests, steps: [{{name: t, command: '{PYTEST} test_unit.py "
        f"{JUNIT}'}}], parser: junit}}\n"
        f"  integ: {{kind: {kind}, steps: [{{name: t, command: '{PYTEST} "
        f"test_integ.py {JUNIT}'}}], parser: junit}}\n")
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return repo


def _one_of_the_flags_merges(tmp_path: Path, repo: Path, plan_id: str, x_extra: str) -> None:
    """Item x (with ``x_extra``) flags x, item y flags y: one merges, the other is sent back
    once and fails, and the integration branch never holds both."""
    plan = write_plan(tmp_path, plan_id, f"""\
        - id: x
          goal: flag x
          {x_extra}
          max_attempts: 1
          executor: {{kind: command, command: 'touch x.flag'}}
        - id: y
          goal: flag y
          max_attempts: 1
          executor: {{kind: command, command: 'touch y.flag'}}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    rows = state["items"]
    assert sorted(r["state"] for r in rows.values()) == ["failed", "merged"], rows
    assert next(r for r in rows.values() if r["state"] == "failed")["sent_back"] == 1
    files = git(repo, "ls-tree", "--name-only", f"choir/plan/{plan_id}/integration").split()
    assert not ("x.flag" in files and "y.flag" in files)


def test_the_integration_round_runs_every_verifier_that_asserted_a_merged_item(
        tmp_path: Path) -> None:
    """Review 16d: item x requires ``integ`` (a lint, which CALM does not plan), item y
    breaks it together with x's change; every round of y and every integration round ran
    CALM's plan, so both merged, the plan was ASSERTed and promoted with ``integ`` failing.
    An integration round runs every verifier whose PASS ASSERTed an item merged into its
    head (a required one, or one a mood climb added)."""
    repo = _flags_repo(tmp_path, "lint")
    _one_of_the_flags_merges(tmp_path, repo, "req", "required_verifiers: [integ]")


def test_a_head_verified_before_is_reused_only_with_every_required_verifier(
        tmp_path: Path) -> None:
    """Review 19b (critical): item x breaks ``integ`` (a lint CALM does not plan, which x
    does not require); item y requires it and changes nothing. x landed first, its head
    verified by ``unit`` alone; y's merged head has exactly that tree, so its round was
    "verified before", the plan was ASSERTed and promoted with ``integ`` failing on it. An
    ASSERT of the tree stands for a round only when every required verifier stood behind it."""
    repo = _flags_repo(tmp_path, "lint")
    (repo / "test_integ.py").write_text(
        "import pathlib\n\ndef test_no_x():\n    assert not pathlib.Path('x.flag').exists()\n")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "integ: no x")
    plan = write_plan(tmp_path, "reuse", """\
        - id: x
          goal: flag x
          max_attempts: 1
          executor: {kind: command, command: 'touch x.flag'}
        - id: y
          goal: keep integ green
          required_verifiers: [integ]
          max_attempts: 1
          executor: {kind: command, command: 'sleep 20'}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    rows = state["items"]
    assert rows["x"]["state"] == "merged", rows
    assert rows["y"]["state"] != "merged", rows  # integ ran on the head y would land
    assert state["status"] != "asserted"


def test_a_paranoid_item_and_the_next_both_merge(tmp_path: Path) -> None:
    """A second review of the fix above: the verifiers behind a PARANOID item's ASSERT
    include Choir's own run checks (its trace verifier, ``unit.mutants``), which no
    integration round can run (not in the allowlist): every such item failed its own
    integration round. Only the allowlist's verifiers are required there."""
    repo = _flags_repo(tmp_path, "lint")
    plan = write_plan(tmp_path, "pp", """\
        - id: x
          goal: flag x
          mood: PARANOID
          max_attempts: 1
          executor: {kind: command, command: 'touch x.flag'}
        - id: y
          goal: flag z
          depends_on: [x]
          max_attempts: 1
          executor: {kind: command, command: 'touch z.flag'}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    assert {k: r["state"] for k, r in state["items"].items()} == {"x": "merged",
                                                                   "y": "merged"}, state
    assert state["status"] == "asserted"
    files = git(repo, "ls-tree", "--name-only", "choir/plan/pp/integration").split()
    assert {"x.flag", "z.flag"} <= set(files)


def test_the_integration_round_runs_in_the_strictest_mood_of_the_plans_items(
        tmp_path: Path) -> None:
    """Two SKEPTICAL items that each pass an integration-tests verifier alone but break it
    together: the integration rounds ran CALM (unit tests only), so both merged and the
    plan was ASSERTed (a review found it). They run in the strictest mood of the plan's
    items now, and the second item's merge is caught."""
    import json

    repo = _flags_repo(tmp_path, "integration_tests")
    _one_of_the_flags_merges(tmp_path, repo, "strict", "mood: SKEPTICAL")
    runs = tmp_path / "choir-home" / "artifacts" / "runs"
    moods = {json.loads((p / "manifest.json").read_text())["mood"]
             for p in runs.glob("verify-*") if p.name.count("-") == 2}
    assert moods == {"SKEPTICAL"}, moods  # every integration round


def test_the_attempts_budget_holds_when_items_start_side_by_side(tmp_path: Path) -> None:
    """With room for three at once, an attempts budget of one started three runs (checked
    once before starting them all): one starts now, the rest are reported blocked."""
    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "bud3", """\
        - id: first
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        - id: second
          goal: write c
          executor: {kind: command, command: 'echo C > c.txt'}
        - id: third
          goal: write d
          executor: {kind: command, command: 'echo D > d.txt'}
        """, max_parallel=3)
    one_attempt(plan)
    state = asyncio.run(run_plan(load_plan(plan)))
    rows = state["items"]
    assert sum(r["attempt"] for r in rows.values()) == 1, rows
    assert sorted(r["state"] for r in rows.values()) == ["blocked", "blocked", "merged"]
    assert all("plan budget spent: attempts 1/1" in r["last"]
               for r in rows.values() if r["state"] == "blocked")
