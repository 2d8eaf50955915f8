"""The merge queue and the plan's checkpoints, for real: heads merged with git, verified in
sandboxes side by side, landed through the gate; the driver killed -9 in every narrow window
of a merge (``CHOIR_FAILPOINT``) and resumed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from choir.team.driver import run_plan
from choir.team.plan import load_plan
from tests import forked
from tests.team import git, team_repo, write_plan
from tests.workitems import PY

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
              pytest.mark.slow]

TWO = """\
    - id: one
      goal: write one
      executor: {kind: command, command: 'echo 1 > one.txt'}
    - id: two
      goal: write two
      executor: {kind: command, command: 'echo 2 > two.txt'}
    """


def choir(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=600, env=env)


def sessions(home: Path) -> list[dict[str, Any]]:
    """Every ``choir verify`` session's manifest under the home (integration rounds are)."""
    found = []
    for path in sorted((home / "artifacts" / "runs").glob("*/manifest.json")):
        data = json.loads(path.read_text())
        if "timestamp_start" in data and data.get("repo"):
            found.append(data)
    return found


def integrate_events() -> list[dict[str, Any]]:
    from choir.ahdb import open_ahdb

    return [e.payload for e in open_ahdb().events() if e.kind == "integrate"]


def test_integration_rounds_of_independent_items_run_side_by_side(
        tmp_path: Path, choir_home: Path) -> None:
    """Merges are serialised, their verification is not: the second item's head (built on
    the first's) is verified while the first's round still runs. Every round takes 4 s
    here, so two rounds one after another cannot overlap."""
    team_repo(tmp_path / "repo", slow_s=4)
    state = asyncio.run(run_plan(load_plan(write_plan(tmp_path, "side", TWO))))
    assert state["status"] == "asserted", state
    rounds = sessions(choir_home)  # the integration rounds (an item's run is no session)
    assert len(rounds) == 2, [s["repo"] for s in rounds]
    (a_start, a_end), (b_start, b_end) = sorted(
        (dt.datetime.fromisoformat(s["timestamp_start"]),
         dt.datetime.fromisoformat(s["timestamp_end"])) for s in rounds)
    assert b_start < a_end, "the integration rounds ran one after another"
    # and each merge names exactly the tree its own round verified
    events = integrate_events()
    assert sorted(e["item"] for e in events) == ["side.one", "side.two"]
    repo = tmp_path / "repo"
    assert git(repo, "rev-parse", "choir/plan/side/integration") == state["integration"]
    assert events[-1]["head"] == state["integration"]
    assert events[-1]["integration_tree"] == state["integration_tree"]
    assert git(repo, "ls-tree", "--name-only", state["integration"]).split() == [
        ".gitignore", "choir.yaml", "one.txt", "slow.txt", "test_tree.py", "two.txt"]


def test_the_plan_is_a_langgraph_thread_and_its_record_never_runs_ahead_of_it(
        tmp_path: Path, choir_home: Path) -> None:
    """The driver is a LangGraph graph checkpointed under ``plan:ID`` (never listed or
    audited as a ``choir run``); ``state.json`` is the checkpointed record, as published."""
    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "lg", TWO)
    state = asyncio.run(run_plan(load_plan(plan), plan_file=plan))
    assert state["status"] == "asserted", state
    with sqlite3.connect(choir_home / "checkpoints.sqlite") as conn:
        threads = {r[0] for r in conn.execute("SELECT DISTINCT thread_id FROM checkpoints")}
    assert "plan:lg" in threads
    from choir.graph.checkpoints import open_checkpointer
    from choir.team.driver import Driver

    async def last() -> Any:
        async with open_checkpointer(choir_home) as saver:
            graph = Driver(load_plan(tmp_path / "plan.yaml")).graph().compile(
                checkpointer=saver)
            return (await graph.aget_state({"configurable": {"thread_id": "plan:lg"}}))

    snap = asyncio.run(last())
    assert not snap.next  # finished
    published = json.loads((choir_home / "plans" / "lg" / "state.json").read_text())
    assert snap.values["record"].model_dump(mode="json") == {
        k: v for k, v in published.items() if k != "updated"} | {"updated": ""}
    listed = json.loads(choir("runs", "list", "--json").stdout)
    assert not [r for r in listed if r["run_id"].startswith("plan:")]
    assert [r["run_id"] for r in listed if r["kind"] == "plan"] == ["lg"]
    audited = choir("audit", "--json")
    assert audited.returncode == 0, audited.stdout[:2000]
    again = choir("plan", "run", "--resume", "lg", "--json")  # finished: nothing runs again
    assert again.returncode == 0 and json.loads(again.stdout)["items"] == state["items"]


@pytest.mark.parametrize(("window", "chain"), [
    ("plan:committed", True), ("plan:built", True), ("plan:integrated", True),
    ("plan:landed", True), ("plan:committed", False), ("plan:integrated", False)])
def test_kill_9_in_each_window_of_a_merge_then_resume_finishes_the_plan_once(
        tmp_path: Path, choir_home: Path, window: str, chain: bool) -> None:
    """Killed between a side effect (a commit, a built head, the integrate event, the branch
    moved) and the checkpoint that records it: the resume finishes the plan with no item run
    twice, one integrate event per item, each naming a tree its round verified, and nothing
    left half merged. ``chain``: ``two`` waits for ``one``, so nothing else is in flight
    when the driver dies; else ``two``'s run (or round) is, wherever it has got to."""
    repo = team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "kw", TWO + ("  depends_on: [one]\n" if chain else ""))
    killed = choir("plan", "run", str(plan), "--json",
                   env={**os.environ, "CHOIR_FAILPOINT": window})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    resumed = choir("plan", "run", "--resume", "kw", "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    state = json.loads(resumed.stdout)
    rows = state["items"]
    assert {k: (r["state"], r["attempt"], r["run_id"]) for k, r in rows.items()} == {
        "one": ("merged", 1, "kw.one.1"), "two": ("merged", 1, "kw.two.1")}, rows
    events = integrate_events()
    assert sorted(e["item"] for e in events) == ["kw.one", "kw.two"], events
    from choir.ahdb import open_ahdb

    db = open_ahdb()
    assert all(db.is_asserted("kw", e["integration_tree"]) for e in events)
    assert git(repo, "rev-parse", "choir/plan/kw/integration") == state["integration"]
    assert git(repo, "ls-tree", "--name-only", state["integration"]).split() == [
        ".gitignore", "choir.yaml", "one.txt", "test_tree.py", "two.txt"]
    runs = {p.name.removesuffix(".jsonl") for p in (choir_home / "traces").glob("*.jsonl")}
    assert {r for r in runs if r.startswith("kw.")} == {"kw.one.1", "kw.two.1"}
    assert git(repo, "status", "--porcelain") == ""
    audited = choir("audit", "--json")
    assert audited.returncode == 0, audited.stdout[:2000]


def test_a_plan_on_a_postgres_store_checkpoints_there(
        tmp_path: Path, choir_home: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``CHOIR_DATABASE_URL`` the plan's thread is in Postgres beside its items' runs
    (nothing in the SQLite file), and it is never listed as a run."""
    import psycopg

    monkeypatch.setenv("CHOIR_DATABASE_URL", pg_url)
    team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "pgp", TWO)
    state = asyncio.run(run_plan(load_plan(plan), plan_file=plan))
    assert state["status"] == "asserted", state
    assert not (choir_home / "checkpoints.sqlite").exists()
    with psycopg.connect(pg_url) as pg:
        threads = {r[0] for r in pg.execute("SELECT DISTINCT thread_id FROM checkpoints")}
    assert {"plan:pgp", "pgp.one.1", "pgp.two.1"} <= threads
    listed = json.loads(choir("runs", "list", "--json").stdout)
    assert sorted(r["run_id"] for r in listed if r["kind"] != "verify") == [
        "pgp", "pgp.one.1", "pgp.two.1"]
    again = choir("plan", "run", "--resume", "pgp", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "asserted"


def test_a_plan_recorded_by_the_earlier_json_driver_is_continued(
        tmp_path: Path, choir_home: Path) -> None:
    """A plan killed under the driver that kept only ``state.json`` (no plan thread; rows in
    its shape): ``--resume`` continues it from that record, no item run twice."""
    repo = team_repo(tmp_path / "repo")
    plan = write_plan(tmp_path, "old", TWO + "  depends_on: [one]\n")
    killed = choir("plan", "run", str(plan), "--json",
                   env={**os.environ, "CHOIR_FAILPOINT": "plan:built"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    with sqlite3.connect(choir_home / "checkpoints.sqlite") as conn:
        for table in ("checkpoints", "writes"):
            conn.execute(f"DELETE FROM {table} WHERE thread_id = 'plan:old'")
    path = choir_home / "plans" / "old" / "state.json"
    record = json.loads(path.read_text())
    legacy = ("state", "attempt", "run_id", "member", "last", "feedback", "goal",
              "depends_on", "base", "commit", "sent_back", "run_s", "integration_s")
    record["items"] = {k: {f: v for f, v in row.items() if f in legacy}
                       for k, row in record["items"].items()}
    del record["queue"], record["schema_version"]
    path.write_text(json.dumps(record))
    assert record["items"]["one"]["state"] == "running"  # its outcome was not recorded yet
    resumed = choir("plan", "run", "--resume", "old", "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = json.loads(resumed.stdout)["items"]
    assert {k: (r["state"], r["attempt"]) for k, r in rows.items()} == {
        "one": ("merged", 1), "two": ("merged", 1)}, rows
    assert git(repo, "show", "choir/plan/old/integration:two.txt") == "2"
