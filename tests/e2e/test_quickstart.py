"""The README's main job, exactly as a new user runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def _shim(tmp_path: Path, base: Path) -> dict[str, str]:
    """An environment whose ``python3`` (Choir's venv, as the README's PATH makes it) reports
    ``base`` as the Python it was made from, and runs Choir's venv otherwise."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "python3"
    shim.write_text(f"""#!/bin/sh
case "$*" in *_base_executable*) echo {base}; echo {Path(sys.prefix).resolve()}; exit 0;; esac
exec {sys.executable} "$@"
""")
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
               CHOIR_HOME=str(tmp_path / "home"))
    env.pop("CHOIR_ARTIFACT_DIR", None)
    env.pop("VIRTUAL_ENV", None)
    return env


@pytest.mark.slow
def test_quickstart_gives_its_project_a_venv_with_pytest_when_the_base_python_has_none(
        tmp_path: Path) -> None:
    """The example's checks run pytest with the Python Choir's venv was made from (a check
    never sees Choir's venv). On a new user's system Python without pytest every round was
    INCONCLUSIVE and the run halted after its nested rounds; now the example's project gets
    a venv with pytest (from the package index, as Choir's install came), and the main job
    runs to its ASSERT with it."""
    bare = tmp_path / "bare"  # a Python without pytest, whatever this machine's base has
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    assert subprocess.run([str(bare / "bin/python"), "-c", "import pytest"],
                          capture_output=True).returncode != 0
    env = _shim(tmp_path, bare / "bin/python")
    env.pop("CHOIR_HOME")
    env["KEEP"] = "1"  # the attestation is read below
    env["PIP_COMPILE"] = "0"  # pytest's install without its bytecode: faster, the same run
    proc = subprocess.run(["bash", str(ROOT / "examples/quickstart/run.sh")], env=env,
                          capture_output=True, text=True, timeout=600)
    work = Path(proc.stdout.split("== working copy: ", 1)[1].split()[0])
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "has no pytest: the example's project gets a venv with it" in proc.stdout
        assert "[green] unit#0 PASS in" in proc.stderr
        assert "ASSERTED  run fix-add-" in proc.stdout and "audit: clean" in proc.stdout
        # the checks ran with that venv: the ASSERT's attestation names it
        line = next(row for row in proc.stdout.splitlines() if " ASSERT " in row)
        shown = subprocess.run(["choir", "attest", "show", line.split()[4]], env=dict(
            env, CHOIR_HOME=str(work / "choir-home")), capture_output=True, text=True)
        assert f'"venv": "{work / "venv"}"' in shown.stdout, shown.stdout + shown.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_quickstart_stops_with_the_fix_when_no_venv_with_pytest_can_be_made(
        tmp_path: Path) -> None:
    """Where the example's venv cannot be made (no ``venv`` module, no package index),
    run.sh says so with the fix (exit 2) and runs nothing, rather than every round ending
    INCONCLUSIVE."""
    base = tmp_path / "base-python3"  # a base interpreter that has nothing
    base.write_text("#!/bin/sh\nexit 1\n")
    base.chmod(0o755)
    proc = subprocess.run(["bash", str(ROOT / "examples/quickstart/run.sh")],
                          env=_shim(tmp_path, base), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(base) in proc.stderr and "python3-pytest" in proc.stderr
    assert "choir run" not in proc.stdout  # nothing ran
    assert not (tmp_path / "home").exists()
