"""examples/postconditions/run.sh, offline, as a user runs it: a lost audit write is caught
by a custom postcondition (drift yellow), fixed from the feedback, then ASSERTed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bwrap
def test_postconditions_example_catches_the_lost_write_then_asserts(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               CHOIR_HOME=str(tmp_path / "home"))
    env.pop("CHOIR_ARTIFACT_DIR", None)
    proc = subprocess.run(["bash", str(ROOT / "examples/postconditions/run.sh")], env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "audit_logged#0 FAIL" in out and "drift verify yellow: audit_logged" in out
    assert "audit_logged#0 PASS" in out and "flag_set#0 PASS" in out
    assert "ASSERTED  run flip-beta-" in out and "attempt 2" in out
    assert "audit: clean" in out
    assert not (ROOT / "examples/postconditions/repo/state/flags.db").exists()
