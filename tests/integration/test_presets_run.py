"""Each preset runs for real in a bubblewrap sandbox and its parser reads what the tool wrote.

pytest, ruff and mypy come from this venv (``.[dev]``), named as the project's interpreter
with ``sandbox: {python: ...}`` (a step never sees Choir's own venv unless the project says so);
bandit runs only when it is installed with its SARIF formatter.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from choir.app.verify import verify_tree
from choir.models import Mood

pytestmark = pytest.mark.skipif(not shutil.which("bwrap") and not os.environ.get("CI"),
                                reason="bubblewrap is not installed")


def _project(root: Path, uses: list[str], *, broken: bool) -> Path:
    root.mkdir()
    body = "def add(a: int, b: int) -> int:\n    return a - b\n" if broken else \
        "def add(a: int, b: int) -> int:\n    return a + b\n"
    if broken:
        body += "import os\n\n\ndef name() -> int:\n    return 'x'\n"
    (root / "calc.py").write_text(body)
    (root / "test_calc.py").write_text(textwrap.dedent("""\
        from calc import add


        def test_add() -> None:
            assert add(2, 3) == 5
        """))
    lines = ["verifiers:"] + [f"  {name}: {{uses: {name}}}" for name in uses]
    lines += ["moods:", f"  PARANOID: {{verifiers: [{', '.join(uses)}]}}",
              f"sandbox: {{python: {sys.executable}}}"]
    (root / "choir.yaml").write_text("\n".join(lines) + "\n")
    return root


def _reports(repo: Path) -> dict[str, dict[str, object]]:
    outcome = verify_tree(repo, mood=Mood.PARANOID, sandbox_name="bwrap")
    return {r["verifier"]: r for r in outcome.contract["reports"]}


def test_pytest_ruff_mypy_presets_pass_on_a_clean_project(tmp_path: Path) -> None:
    repo = _project(tmp_path / "ok", ["pytest", "ruff", "mypy"], broken=False)
    before = sorted(p.name for p in repo.iterdir())
    reports = _reports(repo)
    assert {n: r["result"] for n, r in reports.items()} == {
        "pytest": "PASS", "ruff": "PASS", "mypy": "PASS"}, reports
    assert sorted(p.name for p in repo.iterdir()) == before  # no cache written into the repo


def test_pytest_ruff_mypy_presets_name_each_failure(tmp_path: Path) -> None:
    repo = _project(tmp_path / "bad", ["pytest", "ruff", "mypy"], broken=True)
    reports = _reports(repo)
    assert {n: r["result"] for n, r in reports.items()} == {
        "pytest": "FAIL", "ruff": "FAIL", "mypy": "FAIL"}, reports
    sigs = {n: [s["test_id"] for s in r["failure_signatures"]]  # type: ignore[union-attr]
            for n, r in reports.items()}
    assert any("test_add" in t for t in sigs["pytest"])
    assert "F401" in sigs["ruff"] or "E402" in sigs["ruff"]
    assert "return-value" in sigs["mypy"]


def _bandit_sarif() -> bool:
    from importlib.metadata import entry_points

    return any(e.name == "sarif" for e in entry_points(group="bandit.formatters"))


@pytest.mark.skipif(not _bandit_sarif(), reason="bandit with its SARIF formatter is not installed")
def test_bandit_preset_reports_a_finding(tmp_path: Path) -> None:
    repo = _project(tmp_path / "sec", ["bandit"], broken=False)
    (repo / "danger.py").write_text("import subprocess\nsubprocess.call('ls', shell=True)\n")
    report = _reports(repo)["bandit"]
    assert report["result"] == "FAIL", report
    assert any(s["test_id"] == "B602" for s in report["failure_signatures"])  # type: ignore[union-attr]
    clean = _project(tmp_path / "clean", ["bandit"], broken=False)
    assert _reports(clean)["bandit"]["result"] == "PASS"
