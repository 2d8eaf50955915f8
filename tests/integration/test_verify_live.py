"""``choir verify`` for a person: live progress on a terminal, failing tests as pytest node
ids with file and line, replicas labelled, and the isolation named (a warning for none)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import forked
from tests.integration.test_run_live import ANSI, run_on_a_terminal
from tests.workitems import JUNIT, NO_PLUGINS

PY = sys.executable


def repo_with_failures(path: Path) -> Path:
    (path / "tests").mkdir(parents=True)
    (path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (path / "tests" / "__init__.py").write_text("")
    (path / "tests" / "test_calc.py").write_text(textwrap.dedent("""\
        from calc import add


        class TestAdd:
            def test_positive(self):
                assert add(2, 3) == 5

            def test_zero(self):
                assert add(0, 0) == 0


        def test_negative():
            assert add(-1, -1) == -2
        """))
    (path / "choir.yaml").write_text(textwrap.dedent(f"""\
        verifiers:
          unit:
            uses: pytest
            steps:
              - name: pytest
                command: {NO_PLUGINS} {PY} -m pytest -q -p no:cacheprovider {JUNIT}
          slow:
            kind: smoke
            steps: [{{name: wait, command: "sleep 1.2"}}]
        moods:
          CALM: {{verifiers: [unit, slow], reruns: 2}}
        """))
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", COLUMNS="160")
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True, env=env,
                      timeout=300)


@pytest.mark.slow  # CI's slow stage: the README's command stays under 5 min
def test_fail_summary_names_node_ids_replicas_and_isolation(tmp_path: Path) -> None:
    repo = repo_with_failures(tmp_path / "repo")
    proc = run("verify", "--repo", str(repo), "--sandbox", "local")
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    for node in ("tests/test_calc.py::TestAdd::test_positive  (tests/test_calc.py:5)   "
                 "[unit#0, unit#1]",
                 "tests/test_calc.py::test_negative  (tests/test_calc.py:12)   [unit#0, unit#1]"):
        assert node in out, out
    assert "test_zero" not in out  # it passes: 0 - 0 == 0
    assert "unit#1 (clean_rerun)" in out and "slow#1 (clean_rerun)" in out
    assert "sandbox local (isolation: none)" in out
    assert "warning:" in proc.stderr and "isolates nothing" in proc.stderr
    # the node ids really are what pytest accepts
    node = "tests/test_calc.py::TestAdd::test_positive"
    pasted = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
                            cwd=repo, capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                                     PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"))
    assert "1 failed" in pasted.stdout


def test_verify_in_a_namespace_sandbox_says_so_and_does_not_warn(tmp_path: Path) -> None:
    if not shutil.which("bwrap"):
        import pytest

        pytest.skip("bubblewrap is not installed")
    repo = repo_with_failures(tmp_path / "repo")
    proc = run("verify", "--repo", str(repo), "--sandbox", "bwrap")
    assert "sandbox bwrap (isolation: namespace)" in proc.stdout
    assert "warning:" not in proc.stderr


def test_verify_on_a_terminal_draws_threads_live(tmp_path: Path) -> None:
    repo = repo_with_failures(tmp_path / "repo")
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="160", LINES="40")
    env.pop("CI", None)  # rich treats CI as "not a terminal"
    screen = run_on_a_terminal([PY, "-m", "choir", "verify", "--repo", str(repo),
                                "--sandbox", "local"], env)
    plain = ANSI.sub("", screen)
    assert "\x1b[2K" in screen or "\x1b[1A" in screen, "the view was not redrawn in place"
    assert re.search(r"slow#0\s+│\s+running\s+│\s+\d+\.\ds", plain), "no live running row"
    # the step sleeps 1 s; on a loaded machine its row says 2.3 s as well (CI, 23rd session)
    assert re.search(r"slow#1 \(clean_rerun\)\s+│\s+done\s+│\s+\d+\.\ds\s+│\s+PASS", plain)
    assert re.search(r"unit#0\s+│\s+done\s+│\s+\d+\.\ds\s+│\s+FAIL", plain)
