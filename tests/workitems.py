"""The repo most loop tests work on: ``add`` subtracts, a pytest verifier catches it.

The failing test prints a canary, so a test can check where raw verifier output ended up.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from tests import forked

PY = sys.executable
# what a sandboxed step runs: the base interpreter (it never sees Choir's own venv, #16.7)
STEP_PY = os.path.realpath(sys.executable)
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
# The inner pytest loads no entry-point plugins: none of the test projects needs one, and
# they cost a start of it 0.7 s (the base interpreter's hypothesis, pytest-benchmark) to
# 2.3 s (Choir's venv's langsmith, hypothesis, xdist...) against 0.16 s without: most of
# the README suite's CPU. The tests of plugins themselves (test_spec_attacks, the presets'
# and containment's strict-config runs) leave it out.
NO_PLUGINS = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"
PYTEST = f"{NO_PLUGINS} {STEP_PY} -m pytest -q -p no:cacheprovider"
JUNIT = "--junitxml=$CHOIR_OUT/junit.xml"
# the one pytest verifier of the test repos' choir.yaml
UNIT_VERIFIER = textwrap.dedent(f"""\
    verifiers:
      unit:
        kind: unit_tests
        steps:
          - name: pytest
            command: {PYTEST} {JUNIT}
        parser: junit
    """)


def isolating_pytest(repo: Path, extra: str = "") -> None:
    """A ``unit`` verifier that can run a subset of its tests (the isolated-subset lens);
    ``extra``: more top-level keys of ``choir.yaml``."""
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "choir.yaml").write_text(textwrap.dedent(f"""\
        verifiers:
          unit:
            kind: unit_tests
            steps:
              - name: pytest
                command: {PYTEST}
            parser: pytest
            lenses:
              isolate: {PYTEST} {{tests}}
        """) + textwrap.dedent(extra))


def calc_repo(path: Path, *, canary: str, sandbox: str | None = None,
              test_body: str | None = None, verifiers: str = "", extra: str = "") -> Path:
    """A repo with the bug, a test that prints ``canary`` and fails, and its choir.yaml.

    ``verifiers`` adds entries to the allowlist (YAML indented under ``verifiers:``);
    ``extra`` adds top-level keys (``moods:``, ``models:``, ...).
    """
    path.mkdir(parents=True)
    (path / "calc.py").write_text(BUGGY)
    (path / "test_calc.py").write_text(test_body or textwrap.dedent(f"""\
        from calc import add

        def test_add():
            print("{canary}")
            assert add(2, 3) == 5
        """))
    config = (UNIT_VERIFIER + textwrap.indent(textwrap.dedent(verifiers), "  ")
              + textwrap.dedent(extra))
    if sandbox:
        config += f"sandbox: {{backend: {sandbox}}}\n"
    (path / "choir.yaml").write_text(config)
    return path


def fixing_item(tmp_path: Path, item_id: str = "fix-add") -> Path:
    """A work item over ``tmp_path/repo`` whose executor fixes ``add`` once it has feedback."""
    (tmp_path / "fix.py").write_text(
        "import os, pathlib\n"
        "if os.environ.get('CHOIR_FEEDBACK_FILE'):\n"
        f"    pathlib.Path('calc.py').write_text({FIXED!r})\n")
    item = tmp_path / "item.yaml"
    item.write_text(f"id: {item_id}\ngoal: add must add\nrepo: ./repo\nexecutor:\n"
                    f"  kind: command\n  command: {PY} {tmp_path / 'fix.py'}\n")
    return item


def scripted_item(tmp_path: Path, script: str, *, mood: str, max_attempts: int,
                  verifiers: str = "") -> tuple[int, dict[str, object], int]:
    """``choir run`` of an item over a fresh repo where ``add`` subtracts, its ``unit``
    verifier (pytest, its own parser) and ``verifiers`` (more ``choir.yaml`` lines under
    ``verifiers:``) in bwrap, whose executor runs ``script`` (Python, in the repo). Returns
    the run's exit code, its ``--json`` and ``choir gate``'s exit code for the item."""
    import json
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(BUGGY)
    (repo / "test_calc.py").write_text("from calc import add\n\n"
                                       "def test_add():\n    assert add(2, 3) == 5\n")
    (repo / "choir.yaml").write_text(
        "verifiers:\n  unit:\n    kind: unit_tests\n    parser: pytest\n    steps:\n"
        f"      - {{name: pytest, command: {PYTEST}}}\n{verifiers}"
        "sandbox: {backend: bwrap}\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    executor = tmp_path / "exec.py"
    executor.write_text(script)
    item = tmp_path / "item.yaml"
    item.write_text(f"id: calc\ngoal: add adds\nrepo: {repo}\nmood: {mood}\n"
                    f"max_attempts: {max_attempts}\n"
                    f"executor:\n  kind: command\n  command: {PY} {executor}\n")
    env = {**os.environ, "CHOIR_HOME": str(tmp_path / "home"),
           "CHOIR_ARTIFACT_DIR": str(tmp_path / "home" / "artifacts")}
    proc = forked.run([PY, "-m", "choir", "run", str(item), "--json"], env=env,
                      capture_output=True, text=True, timeout=300)
    gate = forked.run([PY, "-m", "choir", "gate", "calc", "--repo", str(repo)], env=env,
                      capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout), gate.returncode
