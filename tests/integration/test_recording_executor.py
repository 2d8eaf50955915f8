"""``choir.testing.RecordingExecutor`` drives `choir run` offline and records what it got."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from choir.testing import RecordingExecutor
from tests import forked
from tests.workitems import PY, calc_repo

CANARY = "CANARY-recording-executor-raw-output"


def test_recording_executor_drives_a_run_and_sees_only_bounded_feedback(tmp_path: Path) -> None:
    calc_repo(tmp_path / "repo", canary=CANARY, sandbox="local")
    # the executor runs sandboxed: its folder is read-only there, the repo is writable
    log = tmp_path / "repo" / ".calls.jsonl"
    (tmp_path / "scripted.py").write_text(textwrap.dedent(f"""\
        from pathlib import Path
        from choir.testing import RecordingExecutor
        executor = RecordingExecutor(
            edits=[{{}}, {{"calc.py": "def add(a, b):\\n    return a + b\\n"}}],
            log=Path({str(log)!r}))
        """))
    item = tmp_path / "item.yaml"
    item.write_text("id: rec\ngoal: add must add\nrepo: ./repo\nexecutor:\n"
                    "  kind: python\n  function: scripted:executor\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = forked.run([PY, "-m", "choir", "run", str(item), "--json"], env=env,
                      capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["attempt"] == 2
    calls = RecordingExecutor.read_log(log)
    assert [(c["attempt"], c["written"]) for c in calls] == [(1, []), (2, ["calc.py"])]
    assert calls[0]["feedback"] == []
    assert [r["result"] for r in calls[1]["feedback"]] == ["FAIL"]
    assert CANARY not in log.read_text()
