"""The plan through the real CLI: run, gate, promote (refused for a changed tree), and kill -9
mid-plan then ``--resume`` with no merged item run again."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests import forked
from tests.team import git, team_repo, write_plan
from tests.workitems import PY

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
              pytest.mark.slow]  # CI's slow stage: the README's command stays under five minutes


def choir(*args: str) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=300)


def test_gate_and_promote_only_for_exactly_the_integration_tree(tmp_path: Path) -> None:
    repo = team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "rel", """\
        - id: a
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        """)
    ran = choir("plan", "run", str(plan), "--json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    state = json.loads(ran.stdout)
    again = choir("plan", "run", str(plan))  # the same id again: refused, nothing reset
    assert again.returncode == 2 and "--resume rel" in again.stderr + again.stdout
    # ... and from another CHOIR_HOME, where it has no record: it reset the branch the first
    # one landed its work on (found in a review), refused now
    other = forked.run([PY, "-m", "choir", "plan", "run", str(plan)], capture_output=True,
                       text=True, timeout=300,
                       env={**os.environ, "CHOIR_HOME": str(tmp_path / "b")})
    assert other.returncode == 2, other.stdout + other.stderr
    assert "has a branch choir/plan/rel/integration at" in other.stdout + other.stderr
    assert git(repo, "rev-parse", "choir/plan/rel/integration") == state["integration"]
    gate = choir("gate", "rel")
    assert gate.returncode == 0 and "gate: recorded by choir plan run" in gate.stdout, \
        gate.stdout
    listed = json.loads(choir("runs", "list", "--json").stdout)
    assert {"run_id": "rel", "kind": "plan", "status": "asserted"}.items() <= \
        next(r for r in listed if r["kind"] == "plan").items()
    shown = choir("runs", "show", "rel")
    assert "plan rel  ASSERTED" in shown.stdout and "merged" in shown.stdout, shown.stdout
    # the integration branch moves to a tree nobody verified: promotion is refused
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", str(wt), "choir/plan/rel/integration")
    (wt / "a.txt").write_text("sneaked in\n")
    git(wt, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "sneak")
    refused = choir("promote", "rel", "--to", "release")
    assert refused.returncode == 1 and "not at the commit the plan landed" in refused.stdout, \
        refused.stdout
    assert git(repo, "branch", "--list", "release") == ""
    # back to the verified commit: promoted, as a fast forward, the checkout untouched
    git(wt, "reset", "-q", "--hard", state["integration"])
    git(repo, "worktree", "remove", "--force", str(wt))
    ok = choir("promote", "rel", "--to", "release")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert git(repo, "rev-parse", "release") == state["integration"]
    audited = choir("audit", "--json")  # every item, merge, integration round and promotion
    assert audited.returncode == 0, audited.stdout
    assert git(repo, "status", "--porcelain") == "" and git(repo, "branch", "--show-current") \
        == "main"
    # a checked-out branch, and a branch that is not an ancestor, are never moved
    checked_out = choir("promote", "rel", "--to", "main")
    assert checked_out.returncode == 1 and "checked out" in checked_out.stdout
    git(repo, "branch", "-f", "other", git(repo, "commit-tree", "-m", "x",
                                           git(repo, "rev-parse", "main^{tree}")))
    diverged = choir("promote", "rel", "--to", "other")
    assert diverged.returncode == 1 and "not a fast forward" in diverged.stdout


def kill_when(plan: Path, record: Path, item: str, state: str) -> Path:
    """``choir plan run PLAN``, killed -9 as soon as its record shows ``item`` in ``state``."""
    proc = subprocess.Popen([PY, "-m", "choir", "plan", "run", str(plan), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if record.exists() and json.loads(record.read_text())["items"][item]["state"] == state:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return record


# a quick item, then one that takes 3 s: a driver killed while the second runs
FIRST_THEN_SLOW = textwrap.dedent("""\
    - id: first
      goal: quick
      executor: {kind: command, command: 'echo 1 > one.txt'}
    - id: second
      goal: slow
      executor: {kind: command, command: 'sleep 3; echo 2 > two.txt'}
      depends_on: [first]
    """)


@pytest.mark.slow  # CI's slow stage: the README's command stays under 5 min
def test_kill_9_mid_plan_then_resume_runs_no_merged_item_again(
        tmp_path: Path, choir_home: Path) -> None:
    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "dur", FIRST_THEN_SLOW + textwrap.dedent("""\
        - id: third
          goal: slow
          executor: {kind: command, command: 'echo 3 > three.txt'}
          depends_on: [second]
        """), max_parallel=1)
    record = kill_when(plan, choir_home / "plans" / "dur" / "state.json", "second", "running")
    before = json.loads(record.read_text())["items"]
    assert before["first"]["state"] == "merged" and before["third"]["state"] == "pending"
    resumed = choir("plan", "run", "--resume", "dur", "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = json.loads(resumed.stdout)["items"]
    assert all(r["state"] == "merged" for r in rows.values()), rows
    assert rows["first"]["attempt"] == 1 and rows["first"]["run_id"] == "dur.first.1"
    # the run killed mid-way was continued from its checkpoint, not started again
    assert rows["second"]["attempt"] == 1 and rows["second"]["run_id"] == "dur.second.1"
    assert git(tmp_path / "repo", "show", "choir/plan/dur/integration:three.txt") == "3"


@pytest.mark.slow  # CI's slow stage: the README's command stays under 5 min
def test_kill_9_between_an_items_assert_and_its_merge_merges_it_without_running_it_again(
        tmp_path: Path, choir_home: Path) -> None:
    """The item is recorded ASSERTed (with its commit) before its merge and integration
    round: a driver killed in that window merges it on resume; its run is not repeated and
    its tokens are not counted again."""
    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "win", """\
        - id: only
          goal: quick
          executor: {kind: command, command: 'echo 1 > one.txt'}
        """, max_parallel=1)
    record = kill_when(plan, choir_home / "plans" / "win" / "state.json", "only", "asserted")
    before = json.loads(record.read_text())
    assert before["items"]["only"]["state"] == "asserted", before["items"]
    resumed = choir("plan", "run", "--resume", "win", "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = json.loads(resumed.stdout)
    row = after["items"]["only"]
    assert row["state"] == "merged" and row["attempt"] == 1 and row["run_id"] == "win.only.1"
    assert row["commit"] == before["items"]["only"]["commit"]
    assert after["spend"] == before["spend"]  # counted once, when the run ended
    runs = {p.name for p in (choir_home / "runs").iterdir()} if (choir_home / "runs").is_dir() \
        else set()
    assert not {r for r in runs if r.startswith("win.only.2")}


PROBE = """\
import atexit, os, sys

def _probe():  # at exit, after the command ran: what this process could see of the keys
    keys = os.path.join(os.environ["CHOIR_HOME"], "keys")
    try:
        seen = sorted(os.listdir(keys))
    except OSError as exc:
        seen = [type(exc).__name__]
    with open(os.environ["KEY_PROBE"], "a") as fh:
        fh.write(f"{sys.argv[1:3]} {seen}\\n")

atexit.register(_probe)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the mount-namespace level needs root")
def test_plan_run_gate_and_promote_never_see_the_key(tmp_path: Path, choir_home: Path) -> None:
    """They read members' trees, logs and git objects: like ``choir run``, they work
    confined from the key folder, and sign through the broker."""
    from choir.trusted.keyfile import load_key

    load_key(choir_home)
    assert (choir_home / "keys" / "ed25519.key").exists()
    probe_dir, probe = tmp_path / "probe", tmp_path / "probe.txt"
    probe_dir.mkdir()
    (probe_dir / "sitecustomize.py").write_text(PROBE)
    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "sep", """\
        - id: a
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        """)
    env = {**os.environ, "PYTHONPATH": f"{probe_dir}:{os.getcwd()}", "KEY_PROBE": str(probe)}
    for args in (["plan", "run", str(plan), "--json"], ["gate", "sep"],
                 ["promote", "sep", "--to", "release"]):
        done = forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                          timeout=300, env=env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    lines = probe.read_text().splitlines()
    assert len(lines) == 3 and all(line.endswith(" []") for line in lines), lines


def test_a_terminal_gets_a_live_table_of_items(tmp_path: Path, choir_home: Path) -> None:
    """On a TTY: item, member, state, attempt and last verdict per row; redrawn live."""
    import pty

    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "tty", """\
        - id: alpha
          goal: write a
          member: worker
        """)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([PY, "-m", "choir", "plan", "run", str(plan)], stdout=follower,
                            stderr=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "160"})
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=300) == 0
    text = seen.decode("utf-8", "replace")
    for column in ("item", "member", "state", "attempt", "last verdict"):
        assert column in text, text[-2000:]
    assert "alpha" in text and "worker" in text and "running" in text and "merged" in text


@pytest.mark.slow  # CI's slow stage: the README's command stays under 5 min
def test_a_plan_file_whose_items_changed_since_the_kill_is_not_resumed(
        tmp_path: Path, choir_home: Path) -> None:
    """Found by a review: an item removed from the file between kill -9 and `--resume` ended
    in a traceback (its definition gone), and one added was left out while the plan was
    still ASSERTed whole. Both exit 2 naming the file and the ids; restored, it finishes."""
    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "edit", FIRST_THEN_SLOW, max_parallel=1)
    kill_when(plan, choir_home / "plans" / "edit" / "state.json", "second", "running")
    started = plan.read_text()
    cut = started.split("  - id: second")[0] + (
        "  - id: added\n    goal: new\n    executor: {kind: command, command: 'true'}\n")
    plan.write_text(cut)
    refused = choir("plan", "run", "--resume", "edit")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = refused.stdout + refused.stderr
    assert str(plan) in said and "did not start with: added" in said, said
    assert "no longer names items it started with: second" in said and "Traceback" not in said
    plan.write_text(started)
    resumed = choir("plan", "run", "--resume", "edit", "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert {k: r["state"] for k, r in json.loads(resumed.stdout)["items"].items()} == {
        "first": "merged", "second": "merged"}


def test_a_failed_plans_gate_stays_shut_for_any_tree_asked_about(tmp_path: Path) -> None:
    """Review 17h: ``choir gate PLAN --commit choir/plan/PLAN/integration`` (the README's CI
    recipe passes ``--commit``), or ``--repo`` at a checkout of it, skipped the plan's check
    and asked only whether the tree was ASSERTed under the plan's id, which its integration
    round had made: a plan with an item failed and one blocked opened the gate, "recorded
    by a claim". A plan's id is its gate whatever tree is named."""
    repo = team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "part", """\
        - id: a
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        - id: c
          goal: fail
          executor: {kind: command, command: 'echo BROKEN > c.txt'}
          max_attempts: 1
        - id: d
          goal: after c
          executor: {kind: command, command: 'echo D > d.txt'}
          depends_on: [c]
        """)
    choir("plan", "run", str(plan), "--json")
    head = "choir/plan/part/integration"
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", str(wt), head)
    for args in (["gate", "part"], ["gate", "part", "--repo", str(repo), "--commit", head],
                 ["gate", "part", "--repo", str(wt)]):
        gate = choir(*args)
        assert gate.returncode == 1, (args, gate.stdout)
        assert "item d is blocked" in gate.stdout and "a claim" not in gate.stdout, gate.stdout
