"""The unsafe ``local`` backend still runs the project's interpreter, never Choir's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from choir.models import Limits
from choir.sandbox import get_sandbox


def _prefix_seen(repo: Path, out: Path, **options: object) -> str:
    box = get_sandbox("local", **options)
    seen = bytearray()
    result = box.exec('python3 -c "import sys; print(sys.prefix)"', repo=repo, out_dir=out,
                      env={}, timeout_s=60, limits=Limits(), network=False, sink=seen.extend)
    assert result.exit_code == 0, bytes(seen)
    return bytes(seen).decode().strip().splitlines()[-1]


def test_local_runs_the_repos_venv_even_with_choirs_venv_first_on_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(repo / ".venv")],
                   check=True)
    # how the README runs choir: its own venv's bin first on PATH, and maybe activated
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    seen = _prefix_seen(repo, tmp_path / "out")
    assert os.path.realpath(seen) == os.path.realpath(repo / ".venv")


def test_local_without_a_project_venv_runs_the_base_python_not_choirs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    seen = _prefix_seen(repo, tmp_path / "out")
    assert os.path.realpath(seen) != os.path.realpath(sys.prefix)  # not Choir's venv
    assert os.path.realpath(seen) == os.path.realpath(sys.base_prefix)


def test_local_honours_sandbox_python(tmp_path: Path) -> None:
    repo, venv = tmp_path / "repo", tmp_path / "elsewhere"
    repo.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    seen = _prefix_seen(repo, tmp_path / "out", python=str(venv))
    assert os.path.realpath(seen) == os.path.realpath(venv)
