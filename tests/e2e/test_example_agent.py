"""The offline agent example runs as a new user would run it, and shows the contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent" / "release_agent.py"


def test_release_agent_example_runs_offline() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(":", 1) for line in proc.stdout.splitlines())
    assert lines["status"].strip() == "completed"
    assert lines["attempts used"].strip() == "1"
    assert "version='1.5.0'" in lines["output"]
    assert lines["events"].split(" -> ")[4:7] == [
        "invalid_model_response", "turn_started", "verification_rejected"]
