"""The gate's refusal says why when the claim was made on another tree (review 17h)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import forked
from tests.workitems import PY

pytestmark = pytest.mark.bwrap


def test_a_claim_on_a_tree_with_untracked_files_names_the_difference(tmp_path: Path) -> None:
    """The README's flow: ``pip install -e .`` leaves an untracked ``*.egg-info``; ``choir
    verify --claim feature`` verifies the working tree with it, then ``choir gate feature
    --commit HEAD`` refused, hinting to run the claim the user had just run."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "test_a.py").write_text("def test_a(): assert True\n")
    (repo / "choir.yaml").write_text("sandbox: {backend: bwrap}\nverifiers:\n"
                                     "  unit: {uses: pytest}\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    (repo / "mathy.egg-info").mkdir()
    (repo / "mathy.egg-info" / "PKG-INFO").write_text("Name: mathy\n")
    env = {**os.environ, "CHOIR_HOME": str(tmp_path / "home"),
           "CHOIR_ARTIFACT_DIR": str(tmp_path / "home" / "artifacts")}
    verify = forked.run([PY, "-m", "choir", "verify", "--repo", str(repo), "--claim",
                         "feature"], capture_output=True, text=True, timeout=300, env=env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    gate = forked.run([PY, "-m", "choir", "gate", "feature", "--repo", str(repo),
                       "--commit", "HEAD"], capture_output=True, text=True, timeout=120,
                      env=env)
    assert gate.returncode == 1
    assert "is ASSERTed for another tree" in gate.stdout and "untracked" in gate.stdout, \
        gate.stdout
