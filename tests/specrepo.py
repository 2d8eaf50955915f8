"""The repo the spec tests cheat on: ``add`` subtracts; pytest and a postcondition check it.

Built once per test module (``build_templates``) and copied per test; ``run_item`` runs one
work item through the real loop with a scripted ``command`` executor.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import textwrap
import warnings
from pathlib import Path

from choir.graph.runner import RunOutcome, run_work_item
from choir.models import Mood
from tests.workitems import BUGGY, NO_PLUGINS, PY, STEP_PY

GOAL = "add(a, b) must return the sum"
TEST_CALC = textwrap.dedent("""\
    from calc import add

    def test_add():
        assert add(2, 3) == 5
    """)
TEST_OTHER = "def test_other():\n    assert True\n"
CHECK_ADD = textwrap.dedent("""\
    def verify():
        from calc import add
        return {"outcome": "pass" if add(2, 3) == 5 else "fail", "detail": "add(2, 3)"}
    """)
PYTEST = f"{NO_PLUGINS} PYTHONPATH=. {STEP_PY} -m pytest -q -p no:cacheprovider"
UNIT = textwrap.dedent(f"""\
    unit:
      kind: unit_tests
      steps:
        - name: pytest
          command: {PYTEST} --junitxml=$CHOIR_OUT/junit.xml
      parser: junit
    """)
POSTCONDITION = "check_add:\n  callable: verifiers/check_add.py\n  timeout_s: 20\n"
SANDBOX = "sandbox: {backend: bwrap}\n"


def _write_repo(path: Path, verifiers: str) -> None:
    path.mkdir(parents=True)
    (path / "calc.py").write_text(BUGGY)
    (path / "tests").mkdir()
    (path / "tests" / "test_calc.py").write_text(TEST_CALC)
    (path / "tests" / "test_other.py").write_text(TEST_OTHER)
    (path / "verifiers").mkdir()
    (path / "verifiers" / "check_add.py").write_text(CHECK_ADD)
    (path / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    (path / "pyproject.toml").write_text('[project]\nname = "calc"\nversion = "0"\n')
    (path / "choir.yaml").write_text("verifiers:\n" + textwrap.indent(verifiers, "  ")
                                     + SANDBOX)
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)


def build_templates(root: Path) -> dict[str, Path]:
    """The base repos: pytest as the check, or the repo's own postcondition verifier."""
    made = {"unit": root / "unit", "postcondition": root / "postcondition"}
    _write_repo(made["unit"], UNIT)
    _write_repo(made["postcondition"], POSTCONDITION)
    return made


def _executor(tmp_path: Path, body: str) -> str:
    script = tmp_path / "executor.py"
    script.write_text("import os\nfrom pathlib import Path\n"
                      "Path('.attack-ran').write_text('1')\n"
                      "try:\n" + textwrap.indent(textwrap.dedent(body), "    ")
                      + "except OSError as exc:\n    print('the edit was refused:', exc)\n")
    return f"{PY} {script}"


def write_item(tmp_path: Path, template: Path, body: str, extra: str = "",
               sandbox: str = "auto", attempts: int = 1) -> tuple[Path, Path]:
    """A copy of ``template`` and a work item whose executor runs ``body``."""
    repo = tmp_path / "repo"
    shutil.copytree(template, repo, symlinks=True)
    item = tmp_path / "item.yaml"
    item.write_text(f"id: fix-add\ngoal: {GOAL}\nrepo: ./repo\nmax_attempts: {attempts}\n{extra}"
                    f"executor:\n  kind: command\n  sandbox: {sandbox}\n"
                    f"  command: {_executor(tmp_path, body)}\n")
    return item, repo


def run_item(tmp_path: Path, template: Path, body: str, mood: Mood, extra: str = "",
             sandbox: str = "auto", attempts: int = 1) -> tuple[RunOutcome, Path]:
    item, repo = write_item(tmp_path, template, body, extra, sandbox, attempts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # sandbox: none says so, loudly
        return asyncio.run(run_work_item(item, mood=mood)), repo


