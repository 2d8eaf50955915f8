"""``choir verify`` takes its snapshot while it parses the configuration: a configuration
error still wins, nothing of the snapshot is left behind, and a tree that cannot be
snapshotted still stops the run before anything runs on it.

Real files, real git, real ``verify_tree``; no sandbox is reached in these cases.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from choir.app.verify import verify_tree
from choir.exceptions import ConfigError, UserError


@pytest.fixture(autouse=True)
def _home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(tmp_path / "artifacts"))


def _repo(tmp_path: Path, config: str) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    for n in range(200):  # enough files that the snapshot is still running when config fails
        (repo / f"m{n}.py").write_text(f"X = {n}\n" * 50)
    (repo / "choir.yaml").write_text(config)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def _leftovers(tmp_path: Path) -> list[str]:
    root = tmp_path / "artifacts" / "snapshots"
    return [] if not root.exists() else sorted(p.name for p in root.iterdir())


def test_a_configuration_error_wins_and_leaves_no_snapshot(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "verifiers:\n  unit: {parser: nonsense, steps: []}\n")
    with pytest.raises(ConfigError) as err:
        verify_tree(repo)
    assert "choir.yaml" in str(err.value)
    assert _leftovers(tmp_path) == []


def test_a_configuration_error_wins_over_a_tree_that_cannot_be_snapshotted(
        tmp_path: Path) -> None:
    repo = _repo(tmp_path, "verifiers: [not, a, mapping]\n")
    os.symlink("/etc/passwd", repo / "escape")  # the snapshot refuses this link
    with pytest.raises(ConfigError):
        verify_tree(repo)
    assert _leftovers(tmp_path) == []


def test_a_tree_that_cannot_be_snapshotted_stops_the_run(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n"
                           "      - {name: t, command: 'true'}\n")
    os.symlink("/etc/passwd", repo / "escape")
    with pytest.raises(UserError, match="outside the repo"):
        verify_tree(repo, sandbox_name="local")
    assert _leftovers(tmp_path) == []
    assert not (tmp_path / "artifacts" / "runs").exists() or \
        list((tmp_path / "artifacts" / "runs").iterdir()) == []  # nothing ran
