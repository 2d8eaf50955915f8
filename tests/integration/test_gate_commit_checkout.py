"""``choir gate WORK_ITEM --commit X`` answers for what a checkout of X holds (review 18b #2,
#3): the tree hash is of the bytes git stores, and leaves out submodule entries."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import forked
from tests.workitems import PY

pytestmark = pytest.mark.bwrap


def _repo(tmp_path: Path) -> tuple[Path, list[str], dict[str, str]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "test_a.py").write_text("def test_a(): assert True\n")
    (repo / "choir.yaml").write_text("sandbox: {backend: bwrap}\nverifiers:\n"
                                     "  unit: {uses: pytest}\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    env = {**os.environ, "CHOIR_HOME": str(tmp_path / "home"),
           "CHOIR_ARTIFACT_DIR": str(tmp_path / "home" / "artifacts")}
    return repo, git, env


def _choir(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=300, env=env)


def _head(git: list[str]) -> str:
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_commit_whose_checkout_converts_its_files_is_refused(tmp_path: Path) -> None:
    """``*.py ident``: the verified working tree held the blobs' bytes (``$Id$``), and a
    checkout of the commit expands it: code that returns ``a + b`` only while ``$Id$`` is
    unexpanded passed, and the gate opened for a commit whose checkout fails."""
    repo, git, env = _repo(tmp_path)
    (repo / "calc.py").write_text(
        '_V = "$Id$"\n\ndef add(a, b):\n    return a + b if _V == "$" + "Id$" else a - b\n')
    (repo / "test_a.py").write_text("from calc import add\n\ndef test_a():\n"
                                    "    assert add(2, 3) == 5\n")
    (repo / ".gitattributes").write_text("*.py ident\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "C"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    verify = _choir(env, "verify", "--repo", str(repo), "--claim", "feature")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    gate = _choir(env, "gate", "feature", "--repo", str(repo), "--commit", _head(git))
    assert gate.returncode != 0, gate.stdout
    assert "converts" in gate.stdout + gate.stderr and "ident" in gate.stdout + gate.stderr


def test_a_commit_that_repoints_a_submodule_is_not_the_verified_one(tmp_path: Path) -> None:
    """Commit X is the verified commit C with ``vendor`` pointing at another repository's
    commit: the same tree hash (gitlinks are outside it), and the gate opened for X."""
    repo, git, env = _repo(tmp_path)
    (repo / ".gitmodules").write_text('[submodule "vendor"]\n\tpath = vendor\n'
                                      "\turl = ../sub\n")
    subprocess.run([*git, "init", "-q"], check=True, capture_output=True)
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    good, evil = "1" * 40, "2" * 40
    subprocess.run([*git, "update-index", "--add", "--cacheinfo", f"160000,{good},vendor"],
                   check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", "C"], check=True, capture_output=True)
    verified = _head(git)
    verify = _choir(env, "verify", "--repo", str(repo), "--claim", "feature")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # the working tree verified is gated as it is; a commit holding submodule entries only
    # by an ASSERT of that very commit, which a working tree's claim never is (another
    # repository's content is no file of the tree): closed, saying why
    gate = _choir(env, "gate", "feature", "--repo", str(repo))
    assert gate.returncode == 0, gate.stdout + gate.stderr
    gate = _choir(env, "gate", "feature", "--repo", str(repo), "--commit", verified)
    assert gate.returncode == 1 and "submodule" in gate.stdout, gate.stdout
    subprocess.run([*git, "update-index", "--cacheinfo", f"160000,{evil},vendor"],
                   check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", "X"], check=True, capture_output=True)
    gate = _choir(env, "gate", "feature", "--repo", str(repo), "--commit", _head(git))
    assert gate.returncode == 1, gate.stdout
    assert "not ASSERTed" in gate.stdout and "submodule" in gate.stdout, gate.stdout
