"""The README's main job, exactly as a new user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_fails_fixes_passes_and_audits_clean(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               CHOIR_HOME=str(tmp_path / "home"))
    env.pop("CHOIR_ARTIFACT_DIR")
    proc = subprocess.run(["bash", str(ROOT / "examples/quickstart/run.sh")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "unit: FAIL" in out and "test_calc::test_add" in out and "cited: artifact" in out
    assert "fix.py: feedback names ['test_calc::test_add'" in out
    assert "PASS  attestations:" in out
    assert "audit: clean (3 attestations" in out
    # the example itself is never modified: the job works on a copy
    assert "return a - b" in (ROOT / "examples/quickstart/repo/calc.py").read_text()
