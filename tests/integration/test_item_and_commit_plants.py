"""An executor that rewrites the work item it runs under (kept inside the repo), or commits
its own plant (it can write ``.git``), never decides a later run (review 21d)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import textwrap
import warnings
from pathlib import Path

import pytest

from choir.exceptions import UserError
from choir.graph.runner import RunOutcome, run_work_item
from choir.models import Mood
from tests.specrepo import GOAL, build_templates
from tests.workitems import PY

PLANT = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\n"
         "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
         "    outcome.get_result().outcome = 'passed'\n")


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_templates(tmp_path_factory.mktemp("plant-repos"))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=p", "-c", "user.email=p@p",
                           *args], capture_output=True, text=True, check=True).stdout


def run(item: Path, mood: Mood | None = None) -> RunOutcome:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # sandbox: none says so, loudly
        return asyncio.run(run_work_item(item, mood=mood))


def item_in_repo(tmp_path: Path, template: Path, body: str, *, sandbox: str,
                 mood: str = "CALM", commit: bool = True) -> tuple[Path, Path]:
    """A copy of ``template`` holding its own work item (``repo: .``), committed."""
    repo = tmp_path / "repo"
    shutil.copytree(template, repo, symlinks=True)
    script = tmp_path / "executor.py"
    script.write_text("from pathlib import Path\n" + textwrap.dedent(body))
    item = repo / "item.yaml"
    item.write_text(f"id: fix-add\ngoal: {GOAL}\nrepo: .\nmood: {mood}\nmax_attempts: 1\n"
                    f"executor:\n  kind: command\n  sandbox: {sandbox}\n"
                    f"  command: {PY} {script}\n")
    if commit:
        git(repo, "add", "item.yaml")
        git(repo, "commit", "-qm", "the work item")
    return item, repo


LOWER = """\
Path("calc.py").write_text("def add(a, b):\\n    return a + b\\n")
p = Path("item.yaml")
try:
    p.write_text(p.read_text().replace("max_attempts: 1", "max_attempts: 2"))
    print("item.yaml rewritten")
except OSError as exc:
    print("item.yaml edit refused:", exc)
"""


def test_an_item_file_its_executor_rewrote_is_refused_by_the_next_run(
        tmp_path: Path, templates: dict[str, Path]) -> None:
    """Unsandboxed (nothing binds it read-only): run 1's round is refused, run 2 refuses to
    read the item at all."""
    item, _repo = item_in_repo(tmp_path, templates["unit"], LOWER, sandbox="none")
    first = run(item)
    assert "max_attempts: 2" in item.read_text()
    assert first.status != "asserted"
    assert any("item.yaml" in e and "refused" in e for e in first.events)
    with pytest.raises(UserError, match=r"(?s)item\.yaml.*(differs from HEAD|executor)"):
        run(item)


def test_an_item_file_in_the_repo_is_read_only_to_a_sandboxed_executor(
        tmp_path: Path, templates: dict[str, Path]) -> None:
    item, _repo = item_in_repo(tmp_path, templates["unit"], LOWER, sandbox="bwrap",
                               mood="PARANOID")
    before = item.read_text()
    run(item)
    assert item.read_text() == before


def test_an_uncommitted_item_file_in_the_repo_is_refused(
        tmp_path: Path, templates: dict[str, Path]) -> None:
    item, _repo = item_in_repo(tmp_path, templates["unit"], "pass\n", sandbox="none",
                               commit=False)
    with pytest.raises(UserError, match=r"(?s)item\.yaml.*commit it.*outside the repo"):
        run(item)


COMMIT_PLANT = f"""\
import subprocess
if not Path("conftest.py").exists():
    Path("conftest.py").write_text({PLANT!r})
    g = ["git", "-c", "user.name=dev", "-c", "user.email=dev@example.com"]
    subprocess.run([*g, "add", "conftest.py"], check=True)
    subprocess.run([*g, "commit", "-qm", "test setup"], check=True)
"""


def test_a_plant_the_executor_committed_stays_refused_under_a_persons_commit(
        tmp_path: Path, templates: dict[str, Path]) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(templates["unit"], repo, symlinks=True)
    script = tmp_path / "executor.py"
    script.write_text("from pathlib import Path\n" + COMMIT_PLANT)
    item = tmp_path / "item.yaml"
    item.write_text(f"id: fix-add\ngoal: {GOAL}\nrepo: ./repo\nmood: CALM\nmax_attempts: 1\n"
                    f"executor: {{kind: command, sandbox: none, command: {PY} {script}}}\n")
    first = run(item)
    assert first.status != "asserted"
    assert "test setup" in git(repo, "log", "--oneline")
    (repo / "README.md").write_text("# calc\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-qm", "docs")  # a person's commit on top of the plant's
    with pytest.raises(UserError, match=r"conftest\.py.*[0-9a-f]{7,}.*dev"):
        run(item)
