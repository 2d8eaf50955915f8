"""A plan's merges and its promotion are AHDB events: written through the rules, re-derived
by audit; a forged one (a valid chain link, evidence that does not hold) is named by
``choir audit``."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from choir._core.canonical import canonical_json
from choir.ahdb import event_hash, open_ahdb
from choir.team.driver import run_plan
from choir.team.plan import load_plan
from choir.team.promote import promote
from tests import forked
from tests.team import git, team_repo, write_plan

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def audit() -> tuple[int, dict]:  # type: ignore[type-arg]
    proc = forked.run([sys.executable, "-m", "choir", "audit", "--json"],
                      capture_output=True, text=True, timeout=300)
    return proc.returncode, json.loads(proc.stdout)


def _append(home: Path, kind: str, payload: dict) -> None:  # type: ignore[type-arg]
    """A row inserted behind the store's back, with a valid chain link."""
    conn = sqlite3.connect(home / "ahdb.sqlite")
    seq, prev = conn.execute("SELECT seq, event_hash FROM events ORDER BY seq DESC").fetchone()
    created = "2026-01-01T00:00:00+00:00"
    conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
                 (seq + 1, prev, event_hash(prev, seq + 1, kind, payload, created), kind,
                  canonical_json(payload).decode(), created))
    conn.commit()
    conn.close()


def _asserted(tmp_path: Path, plan_id: str) -> tuple[Path, dict]:  # type: ignore[type-arg]
    """A plan of one item that writes ``a.txt``, run to its ASSERT: (its repo, its record)."""
    repo = team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, plan_id, """\
        - id: a
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    assert state["status"] == "asserted", {k: r.get("last") for k, r in state["items"].items()}
    return repo, state


def test_a_promotion_is_a_checked_event_and_a_forged_one_is_named_by_audit(
        tmp_path: Path, choir_home: Path) -> None:
    repo, state = _asserted(tmp_path, "pr")
    head = promote("pr", "release")
    assert git(repo, "rev-parse", "release") == head
    (event,) = [e for e in open_ahdb().events() if e.kind == "release"]
    assert event.payload["plan"] == "pr" and event.payload["commit"] == head
    assert event.payload["tree_hash"] == state["integration_tree"]
    assert set(event.payload["items"]) == {"pr.a"}
    (merge,) = [e for e in open_ahdb().events() if e.kind == "integrate"]
    assert merge.payload["item"] == "pr.a" and merge.payload["head"] == head
    assert merge.payload["integration_tree"] == state["integration_tree"]
    code, report = audit()
    assert code == 0, report  # the replay re-derives the merge and the promotion
    # forged: a merge whose integration tree no round verified
    _append(choir_home, "integrate", {**merge.payload, "integration_tree": "1" * 64})
    # forged: the plan's real ASSERT, but released for a tree nobody verified
    _append(choir_home, "release", {**event.payload, "tree_hash": "0" * 64, "branch": "x"})
    # forged: a plan that never ran, naming an item ASSERT it does not own
    _append(choir_home, "release", {**event.payload, "plan": "ghost", "branch": "y"})
    code, report = audit()
    flagged = [v for v in report["violations"] if v["kind"] == "ahdb_rule"]
    assert code != 0 and len(flagged) == 3, report
    assert sorted(v["object"].split("(")[1] for v in flagged) == [
        "integrate)", "release)", "release)"], flagged


def test_a_promotion_whose_event_cannot_be_written_moves_no_branch(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The event is written first, then the ref moves: when the write fails (injected
    here: the store refusing after the gate held), no branch moves."""
    import choir.team.promote as module
    from choir.exceptions import PromotionError

    repo = _asserted(tmp_path, "rb")[0]
    base = git(repo, "rev-parse", "main")
    git(repo, "branch", "old", base)

    def refuse(*args: object) -> None:
        raise PromotionError("injected: the store refused the event")

    monkeypatch.setattr(module, "_record", refuse)
    for branch, before in (("new", ""), ("old", base)):
        with pytest.raises(PromotionError):
            promote("rb", branch)
        after = git(repo, "branch", "--list", branch) and git(repo, "rev-parse", branch)
        assert after == before, branch
    assert not [e for e in open_ahdb().events() if e.kind == "release"]


KILLED_PROMOTE = """
import os, signal, sys
import choir.team.promote as module
if sys.argv[1] == "in-record":  # kill -9 where the event is being written
    module._record = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
module.promote(sys.argv[2], sys.argv[3])
"""


def test_a_promotion_killed_at_any_point_moves_no_branch_without_its_event(
        tmp_path: Path, choir_home: Path) -> None:
    """The branch moved first and the event was written after: a kill -9 between them left
    the branch moved with no release event, and audit clean (a review found it). The event
    is written first now; a promotion killed after it moved nothing, and the next
    ``promote`` moves the branch without writing the event twice."""
    import os

    repo = _asserted(tmp_path, "kp")[0]
    base = git(repo, "rev-parse", "main")
    git(repo, "branch", "release", base)
    root = Path(__file__).parents[2]
    for where, env in (("in-record", {}), ("after-event", {"CHOIR_FAILPOINT": "plan:released"})):
        child = subprocess.run([sys.executable, "-c", KILLED_PROMOTE, where, "kp", "release"],
                               cwd=root, capture_output=True, text=True, timeout=300,
                               env={**os.environ, **env})
        assert child.returncode == -9, (where, child.stderr[-2000:])
        assert git(repo, "rev-parse", "release") == base, where  # nothing moved
    assert len([e for e in open_ahdb().events() if e.kind == "release"]) == 1
    head = promote("kp", "release")  # finishes what the killed one began
    assert git(repo, "rev-parse", "release") == head != base
    (event,) = [e for e in open_ahdb().events() if e.kind == "release"]
    assert (event.payload["commit"], event.payload["from"]) == (head, base)
    code, report = audit()
    assert code == 0, report


def test_a_release_is_decided_by_the_signed_log_not_the_tables(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 12 (F1/F2 on ``choir promote``): rows planted in the tables (the plan's ASSERT
    copied onto a tree no round verified, with its claim) made ``_record`` find a live ASSERT
    and write the release; and one event appended without the key was counted. Both are
    refused now, and nothing is written (watched: the release was recorded before)."""
    from choir.ahdb import AHDB
    from choir.attest import AttestationStore
    from choir.evidence.artifacts import ArtifactStore
    from choir.exceptions import PromotionError
    from choir.team.promote import _record
    from choir.team.queue import integration_branch

    repo, state = _asserted(tmp_path, "pt")
    head = git(repo, "rev-parse", integration_branch("pt"))
    forged_tree = "f" * 64
    conn = sqlite3.connect(choir_home / "ahdb.sqlite")
    for atom_id, seq, kind, status, work_item, body in conn.execute(
            "SELECT id, created_seq, kind, status, work_item, body FROM atoms "
            "WHERE work_item = 'pt' AND status = 'PROMOTED'").fetchall():
        data = json.loads(body)
        data["id"], data["tree_hash"] = atom_id[::-1], forged_tree  # ids of its own
        data["references"] = [r[::-1] for r in data.get("references") or ()]
        conn.execute("INSERT INTO atoms VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (atom_id[::-1], seq, kind, status, work_item, forged_tree,
                      json.dumps(data)))
    conn.commit()
    conn.close()
    assert open_ahdb().is_asserted("pt", forged_tree) is not None  # the tables say so
    with pytest.raises(PromotionError, match="no live ASSERT"):
        _record("pt", state, head, forged_tree, "release", None)
    assert not [e for e in open_ahdb().events() if e.kind == "release"]

    forger = AHDB(attestations=AttestationStore(), artifacts=ArtifactStore(), signer=None)
    forger.propose(claim="anything", work_item="x", tree_hash="e" * 64,
                   required_verifiers=["unit"])
    with pytest.raises(PromotionError, match="not covered by a trusted signed head"):
        _record("pt", state, head, state["integration_tree"], "release", None)
    assert not [e for e in open_ahdb().events() if e.kind == "release"]


def test_promote_moves_nothing_but_the_landed_commit_to_a_plain_branch(tmp_path: Path) -> None:
    """Found by a review, each watched passing before: the integration branch moved by
    anyone with the repo (to the verified tree plus a submodule entry, or a merge bringing
    in an unverified history) was promoted, its tree being all the gate read; ``--to`` a
    symbolic ref moved the checked-out branch it names; ``--to`` an option, a plan's own
    branch or a name git refuses was taken (some after their event was written); and a
    promotion run again after it had moved its branch wrote a second event."""
    from choir.exceptions import UserError

    repo, state = _asserted(tmp_path, "pr")
    landed = state["integration"]
    branch = "choir/plan/pr/integration"
    tree = git(repo, "rev-parse", f"{landed}^{{tree}}")
    with_gitlink = subprocess.run(
        ["git", "-C", str(repo), "mktree"], capture_output=True, text=True, check=True,
        input=git(repo, "ls-tree", landed) + f"\n160000 commit {'1' * 40}\tvendor\n").stdout
    forged = git(repo, "-c", "user.name=x", "-c", "user.email=x@x", "commit-tree",
                 with_gitlink.strip(), "-p", landed, "-m", "vendor")
    other = git(repo, "-c", "user.name=x", "-c", "user.email=x@x", "commit-tree", tree,
                "-m", "unverified history")
    merged = git(repo, "-c", "user.name=x", "-c", "user.email=x@x", "commit-tree", tree,
                 "-p", landed, "-p", other, "-m", "merge")
    for moved in (forged, merged):
        git(repo, "update-ref", f"refs/heads/{branch}", moved)
        with pytest.raises(UserError, match="not at the commit the plan landed"):
            promote("pr", "release")
        assert git(repo, "branch", "--list", "release") == ""
    git(repo, "update-ref", f"refs/heads/{branch}", landed)

    git(repo, "symbolic-ref", "refs/heads/alias", "refs/heads/main")  # main is checked out
    events = len(list(open_ahdb().events()))
    for bad, why in (("alias", "symbolic ref"), ("-x", "not a branch name"),
                     ("HEAD", "not a branch name"), ("refs/heads/main", "not a branch name"),
                     ("choir/plan/pr/item/a", "not a branch name"),
                     ("main.lock", "not a branch name"), ("a..b", "not a branch name")):
        with pytest.raises(UserError, match=why):
            promote("pr", bad)
    assert len(list(open_ahdb().events())) == events  # no event for any of them
    assert git(repo, "status", "--porcelain") == ""  # main, checked out, never moved

    assert promote("pr", "release") == landed
    after = len(list(open_ahdb().events()))
    assert promote("pr", "release") == landed  # again, as after a kill past its move
    assert len(list(open_ahdb().events())) == after
    # review 16c: a tag of the branch's name was read as the branch, and the move then
    # failed every time ("moved while it was promoted")
    git(repo, "tag", "vA", git(repo, "rev-parse", "main"))
    assert promote("pr", "vA") == landed
    assert git(repo, "rev-parse", "refs/heads/vA") == landed
    assert git(repo, "rev-parse", "refs/tags/vA") != landed  # the tag is not moved


def test_promote_says_a_usage_error_with_exit_2_and_a_refusal_with_exit_1(
        tmp_path: Path) -> None:
    proc = forked.run([sys.executable, "-m", "choir", "promote", "no-such-plan", "--to",
                       "release"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no plan no-such-plan" in proc.stderr, proc.stderr


def test_a_planted_plan_record_never_turns_a_gate_into_a_plans(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 16e: ``choir gate NAME`` in a checkout took the plan path whenever
    ``plans/NAME/state.json`` existed, and answered for the tree that unsigned file named:
    an old tree of a ``choir verify --claim NAME`` that PASSed opened the gate for the
    current tree, which FAILs. A plan is one whose merges are in the AHDB's log."""
    from tests.integration.test_verify_cli import CALC_BUG, CALC_OK, make_repo
    from tests.integration.test_verify_cli import run as choir

    repo = make_repo(tmp_path / "calc", CALC_OK)
    assert choir("verify", "--repo", str(repo), "--claim", "feature").returncode == 0
    old = json.loads(choir("verify", "--repo", str(repo), "--json").stdout)["manifest"]
    (repo / "calc.py").write_text(CALC_BUG)
    assert choir("verify", "--repo", str(repo), "--claim", "feature").returncode == 1
    assert choir("gate", "feature", cwd=repo).returncode == 1
    record = choir_home / "plans" / "feature" / "state.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"plan": "feature", "status": "asserted", "repo": str(repo),
                                  "base": "0" * 40, "integration": "0" * 40,
                                  "integration_tree": old["tree_hash"], "items": {}}))
    gate = choir("gate", "feature", cwd=repo)
    assert gate.returncode == 1, gate.stdout
    assert "choir plan run" not in gate.stdout


def test_a_plans_gate_and_promote_hold_the_rollback_anchors(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 16e: the plan's gate and ``choir promote`` checked no high-water mark and no
    pinned head, so a home put back from before a FAIL (which had demoted the plan's
    ASSERT) opened both. Here the home is put back behind a head the gate has seen."""
    from tests.evidence import attest, make_repo
    from tests.integration.test_verify_cli import run as choir

    repo, _state = _asserted(tmp_path, "anch")
    assert choir("gate", "anch").returncode == 0  # the mark: this head
    before = tmp_path / "home-before"
    shutil.copytree(choir_home, before, symlinks=True)
    attest(make_repo(tmp_path / "other"), "lint", "true")  # the log grows ...
    assert choir("gate", "anch").returncode == 0  # ... and the gate sees it
    shutil.rmtree(choir_home)
    shutil.copytree(before, choir_home, symlinks=True)  # put back
    gate = choir("gate", "anch")
    assert gate.returncode == 1 and "rolled back" in gate.stdout, gate.stdout
    moved = choir("promote", "anch", "--to", "release")
    assert moved.returncode == 1 and "rolled back" in moved.stdout, moved.stdout
    assert git(repo, "branch", "--list", "release") == ""


def test_a_plans_gate_opens_for_no_commit_with_a_submodule_entry_it_never_landed(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 19b (high): ``choir gate PLAN --commit SHA`` checked the commit's tree alone;
    the sha, kept because the commit holds a submodule entry the tree hash leaves out, was
    dropped for a plan, so the plan's final tree plus a gitlink nobody verified opened it."""
    from tests.integration.test_verify_cli import run as choir

    repo, state = _asserted(tmp_path, "sub")
    landed = state["integration"]
    with_gitlink = subprocess.run(
        ["git", "-C", str(repo), "mktree"], capture_output=True, text=True, check=True,
        input=git(repo, "ls-tree", landed) + f"\n160000 commit {'1' * 40}\tvendor\n").stdout
    forged = git(repo, "-c", "user.name=x", "-c", "user.email=x@x", "commit-tree",
                 with_gitlink.strip(), "-p", landed, "-m", "vendor")
    gate = choir("gate", "sub", "--repo", str(repo), "--commit", forged)
    assert gate.returncode == 1 and "submodule" in gate.stdout, gate.stdout
    assert choir("gate", "sub", "--repo", str(repo), "--commit", landed).returncode == 0


def test_promote_refuses_a_head_whose_checkout_converts_the_verified_bytes(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 19b (medium): the base's ``*.sh eol=crlf`` and an item that adds ``run.sh``:
    the rounds verified the bytes git stores (LF), a checkout of the promoted branch holds
    CRLF. ``choir gate PLAN --commit`` refused that head (review 18b); promote moved the
    branch to it."""
    from choir.exceptions import UserError
    from tests.workitems import JUNIT, PYTEST

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "test_tree.py").write_text(
        "import pathlib\n\ndef test_run_sh():\n    p = pathlib.Path('run.sh')\n"
        "    assert not p.exists() or b'\\r' not in p.read_bytes()\n")
    (repo / "choir.yaml").write_text(
        f"verifiers:\n  unit: {{kind: unit_tests, steps: [{{name: t, command: '{PYTEST} "
        f"{JUNIT}'}}], parser: junit}}\nsandbox: {{backend: bwrap}}\n")
    (repo / ".gitignore").write_text("__pycache__/\n")
    (repo / ".gitattributes").write_text("*.sh eol=crlf\n")  # the base's own
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    plan = write_plan(tmp_path, "crlf", """\
        - id: a
          goal: add run.sh
          max_attempts: 1
          executor: {kind: command, command: 'printf "echo ok\\\\n" > run.sh'}
        """)
    ran = forked.run([sys.executable, "-m", "choir", "plan", "run", str(plan), "--json"],
                     capture_output=True, text=True, timeout=600)
    state = json.loads(ran.stdout)
    assert state["status"] == "asserted", {k: r.get("last") for k, r in state["items"].items()}
    with pytest.raises(UserError, match="converts its files"):
        promote("crlf", "release")
    assert git(repo, "branch", "--list", "release") == ""


def test_dropping_a_failed_item_from_the_plans_record_opens_no_gate(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 19b (critical): the plan's gate and promote took its items, and its status,
    from ``plans/ID/state.json``, a file anyone who can write the home edits without a key:
    a failed item deleted from it and the status set to asserted opened the gate and moved
    the branch, and audit stayed clean. The plan's items are an event of the signed log."""
    from choir.exceptions import UserError
    from tests.integration.test_verify_cli import run as choir

    repo = team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "drop", """\
        - id: a
          goal: write a
          max_attempts: 1
          executor: {kind: command, command: 'echo A > a.txt'}
        - id: b
          goal: write b
          max_attempts: 1
          executor: {kind: command, command: 'echo BROKEN > c.txt'}
        """)
    state = asyncio.run(run_plan(load_plan(plan)))
    assert {k: r["state"] for k, r in state["items"].items()} == {"a": "merged",
                                                                   "b": "failed"}, state
    assert choir("gate", "drop").returncode == 1
    record = choir_home / "plans" / "drop" / "state.json"
    edited = json.loads(record.read_text())
    del edited["items"]["b"]
    edited["status"] = "asserted"
    record.write_text(json.dumps(edited))
    gate = choir("gate", "drop")
    assert gate.returncode == 1 and "item b" in gate.stdout, gate.stdout
    with pytest.raises(UserError, match="item b"):
        promote("drop", "release")
    assert git(repo, "branch", "--list", "release") == ""
    # Below the gate, the rules themselves: a release naming the plan's items must name
    # every item the plan declared (the audit replays the same rule); it named any live
    # ASSERTs before, and this one, b left out, was written.
    from choir.exceptions import PromotionError
    from choir.team.promote import _record
    from choir.team.queue import integration_branch

    head = git(repo, "rev-parse", integration_branch("drop"))
    tree = open_ahdb().merges("drop")[-1]["integration_tree"]
    with pytest.raises(PromotionError, match="declared"):
        _record("drop", edited, head, tree, "release", None)
    assert not [e for e in open_ahdb().events() if e.kind == "release"]
