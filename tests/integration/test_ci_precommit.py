"""The pre-commit hooks (``.pre-commit-hooks.yaml``) through the real ``pre-commit`` tool.

``pre-commit try-repo`` reads the hook definitions from a git repository, as a user's
``.pre-commit-config.yaml`` would, and runs them on a real repo; then the hook is installed
and a commit of a failing tree is refused. ``choir-system`` (the choir already installed)
needs no network; ``choir`` (pre-commit builds an environment with Choir from this repo)
needs the package index for Choir's dependencies, once, and is marked slow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_ci_github import committed, git
from tests.integration.test_verify_cli import CALC_BUG, CALC_OK, make_repo, sandbox_name

pytestmark = pytest.mark.slow  # CI's slow stage: the README's command stays under five minutes

ROOT = Path(__file__).resolve().parents[2]
PRE_COMMIT = [sys.executable, "-m", "pre_commit"]


def hook_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # choir-ci of this install, for choir-system
    return dict(os.environ, PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"),
                PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                CHOIR_CI_SANDBOX=sandbox_name(), PYTHONDONTWRITEBYTECODE="1")


def hook_repo(tmp_path: Path) -> Path:
    """A git repository holding this project's hook definitions, as users reference it."""
    repo = tmp_path / "hooks"
    repo.mkdir()
    shutil.copy(ROOT / ".pre-commit-hooks.yaml", repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "hooks")
    return repo


def pre_commit(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PRE_COMMIT, *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=900)


def test_the_hook_passes_a_good_tree_and_fails_a_failing_one(tmp_path: Path) -> None:
    hooks, env = hook_repo(tmp_path), hook_env(tmp_path)
    repo = committed(make_repo(tmp_path / "repo", CALC_OK))
    passed = pre_commit(repo, env, "try-repo", str(hooks), "choir-system", "--all-files")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "choir verify and gate (installed choir)" in passed.stdout
    assert "Passed" in passed.stdout

    (repo / "calc.py").write_text(CALC_BUG)
    git(repo, "add", "calc.py")
    failed = pre_commit(repo, env, "try-repo", str(hooks), "choir-system", "--all-files")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "choir: FAIL" in failed.stdout and "gate pre-commit: refused" in failed.stdout
    assert "failing: test_calc.py::test_add" in failed.stdout


def test_the_installed_hook_refuses_a_failing_commit(tmp_path: Path) -> None:
    hooks, env = hook_repo(tmp_path), hook_env(tmp_path)
    repo = committed(make_repo(tmp_path / "repo", CALC_OK))
    rev = subprocess.run(["git", "-C", str(hooks), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=True).stdout.strip()
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {hooks}\n    rev: {rev}\n    hooks:\n      - id: choir-system\n")
    (repo / "calc.py").write_text(CALC_BUG)
    git(repo, "add", ".pre-commit-config.yaml", "calc.py")
    assert pre_commit(repo, env, "install").returncode == 0
    before = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout
    commit = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c",
                             "user.email=t@t", "commit", "-q", "-m", "break add"],
                            capture_output=True, text=True, env=env, timeout=900)
    assert commit.returncode != 0 and "choir: FAIL" in commit.stdout + commit.stderr
    after = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                           text=True, check=True).stdout
    assert after == before


@pytest.mark.slow
def test_the_python_hook_builds_choir_from_this_repo(tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    env["PIP_COMPILE"] = "0"  # pip's compile of every installed module: most of its CPU,
    # and nothing this test shows (``PIP_NO_COMPILE=1`` would read as ``--compile``)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if p != str(Path(sys.executable).parent))
    repo = committed(make_repo(tmp_path / "repo", CALC_OK))
    proc = pre_commit(repo, env, "try-repo", str(ROOT), "choir", "--all-files")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "choir verify and gate" in proc.stdout and "Passed" in proc.stdout
