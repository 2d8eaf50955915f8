"""The README's main job, exactly as a new user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_fails_hypothesizes_fixes_passes_asserts_and_audits_clean(
    tmp_path: Path,
) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               CHOIR_HOME=str(tmp_path / "home"))
    env.pop("CHOIR_ARTIFACT_DIR")
    proc = subprocess.run(["bash", str(ROOT / "examples/quickstart/run.sh")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out, err = proc.stdout, proc.stderr
    assert "[green] unit#0 FAIL in" in err and "hypothesis sent to the executor" in err
    assert "[green] unit#0 PASS in" in err
    assert "ASSERTED  run fix-add-" in out and "attempt 2" in out
    assert "gate: fix-add ASSERTed" in out
    # the hypothesis is confirmed by the round that passes: promoted, beside the ASSERT
    assert "HYPOTHESIZE PROMOTED" in out and "ASSERT      PROMOTED" in out
    assert "audit: clean" in out
    # the example itself is never modified: the job works on a copy
    assert "return a - b" in (ROOT / "examples/quickstart/repo/calc.py").read_text()
    # and it leaves no working copy behind in /tmp
    work = out.split("== working copy: ", 1)[1].split()[0]
    assert work.startswith(("/tmp", os.environ.get("TMPDIR", "/tmp"))) and not Path(work).exists()


def test_quickstart_stops_with_the_fix_when_the_base_python_has_no_pytest(
        tmp_path: Path) -> None:
    """The example's checks run pytest with the Python the venv was made from (a check never
    sees Choir's venv). A new user's system Python without pytest made every round
    INCONCLUSIVE and the run halt after its nested rounds; run.sh now says so first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    base = tmp_path / "base-python3"  # a base interpreter without pytest
    base.write_text("#!/bin/sh\nexit 1\n")
    base.chmod(0o755)
    shim = bin_dir / "python3"  # the venv's python3: names that base
    shim.write_text(f"#!/bin/sh\necho {base}\n")
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
               CHOIR_HOME=str(tmp_path / "home"))
    proc = subprocess.run(["bash", str(ROOT / "examples/quickstart/run.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(base) in proc.stderr and "python3-pytest" in proc.stderr
    assert "choir run" not in proc.stdout  # nothing ran
    assert not (tmp_path / "home").exists()
