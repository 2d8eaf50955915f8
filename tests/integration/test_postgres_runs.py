"""Runs on a Postgres store: checkpoints survive kill -9, and a lease lets one runner drive.

Real CLI processes, a real Postgres server, real sandboxes; the run's executor sleeps in
attempt 2 (``SLOW_FIX``) so a runner can be killed mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_orchestrator import choir, fix_cmd, make_item, spy
from tests.workitems import PY


def _start(item: Path, run_id: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([PY, "-m", "choir", "run", str(item), "--run-id", run_id],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _until_executing(tmp_path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180
    while not (spy(tmp_path) / "executing").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)


@pytest.mark.slow
def test_kill_9_then_resume_from_postgres_checkpoints(
        tmp_path: Path, choir_home: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    monkeypatch.setenv("CHOIR_DATABASE_URL", pg_url)
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    proc = _start(item, "crashy", dict(os.environ, SLOW_FIX="1"))
    try:
        _until_executing(tmp_path, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (choir_home / "checkpoints.sqlite").exists()  # nothing went to the SQLite file
    with psycopg.connect(pg_url) as pg:
        (n,) = pg.execute("SELECT count(*) FROM checkpoints WHERE thread_id = 'crashy'"
                          ).fetchone()
    assert n > 0
    resumed = choir("run", "--resume", "crashy", "--json")
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["status"] == "asserted" and out["attempt"] == 2  # attempt 2 redone, not 3
    assert choir("audit").returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_waiting_runner_takes_the_lease_when_the_driver_is_killed(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if backend == "postgres":
        monkeypatch.setenv("CHOIR_DATABASE_URL", request.getfixturevalue("pg_url"))
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    first = _start(item, "busy", dict(os.environ, SLOW_FIX="1"))
    waiter = None
    try:
        _until_executing(tmp_path, first)
        refused = choir("run", "--resume", "busy")  # no wait: refuses clearly, at once
        assert refused.returncode == 2
        assert "run busy is being driven by another process" in refused.stderr
        assert "CHOIR_LEASE_WAIT_S" in refused.stderr
        if backend == "postgres":  # another machine (its own CHOIR_HOME) is refused too
            other = dict(os.environ, CHOIR_HOME=str(tmp_path / "machine-b"))
            elsewhere = choir("run", "--resume", "busy", env=other)
            assert elsewhere.returncode == 2, elsewhere.stderr
            assert "being driven by another process" in elsewhere.stderr
        waiter = subprocess.Popen([PY, "-m", "choir", "run", "--resume", "busy", "--json"],
                                  env=dict(os.environ, CHOIR_LEASE_WAIT_S="240"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
        time.sleep(3)
        assert waiter.poll() is None  # it waits for the lease, it does not drive
        assert first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver dies mid-attempt 2
        first.wait()
    assert waiter is not None
    stdout, stderr = waiter.communicate(timeout=240)
    assert waiter.returncode == 0, stderr.decode()
    out = json.loads(stdout)
    assert out["status"] == "asserted" and out["attempt"] == 2
    assert choir("audit").returncode == 0
