"""The one attempt budget is checkpointed state: a run killed with SIGKILL and resumed from a
fresh process never runs the executor more than ``max_attempts`` times."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.integration.test_orchestrator import choir
from tests.workitems import PY, calc_repo


@pytest.mark.slow
def test_the_budget_survives_kill_9_and_a_resume_from_a_fresh_process(tmp_path: Path) -> None:
    from choir._core.failpoints import ENV

    calc_repo(tmp_path / "repo", canary="canary")
    log = tmp_path / "repo" / ".spy" / "runs.log"
    log.parent.mkdir()
    (tmp_path / "lost.py").write_text(  # an executor that never fixes anything
        f"with open({str(log)!r}, 'a') as fh:\n    fh.write('ran\\n')\n")
    item = tmp_path / "item.yaml"
    command = json.dumps(f"{PY} {tmp_path}/lost.py")
    item.write_text(f"id: fix-add\ngoal: add is right\nrepo: ./repo\nmax_attempts: 2\n"
                    f"executor:\n  kind: command\n  command: {command}\n")
    crashed = choir("run", str(item), "--run-id", "kb",
                    env=dict(os.environ, **{ENV: "adjudicate:written"}))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert log.read_text().count("ran") == 1
    resumed = choir("run", "--resume", "kb", "--json")
    assert resumed.returncode == 1, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["status"] == "halted"
    assert "attempt budget spent (2/2)" in out["reason"]
    assert log.read_text().count("ran") == 2
