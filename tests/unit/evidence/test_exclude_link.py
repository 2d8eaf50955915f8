"""``.git/info/exclude`` is read by git for every listing of the tree and followed when it
is a link: an executor (it can write ``.git``) pointed it at a file the runner may read (a
held-out check), and the names the tree lists then answered, round by round, which guessed
lines that file holds (review 22c, unconfirmed: closed here all the same). Choir refuses a
repository whose ``info`` folder or ``info/exclude`` is a link or a special file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from choir.evidence.git import locate
from choir.exceptions import UserError


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_a_linked_exclude_file_is_refused(repo: Path, tmp_path: Path) -> None:
    secret = tmp_path / "held_out_test.py"
    secret.write_text("def test_hidden(): assert f(41) == 42\n")
    exclude = repo / ".git" / "info" / "exclude"
    exclude.unlink(missing_ok=True)
    exclude.symlink_to(secret)
    with pytest.raises(UserError, match="info/exclude.*link"):
        locate(repo)


def test_a_linked_info_folder_is_refused(repo: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "exclude").write_text("*.secret\n")
    info = repo / ".git" / "info"
    for child in info.iterdir():
        child.unlink()
    info.rmdir()
    info.symlink_to(elsewhere)
    with pytest.raises(UserError, match="info.*link"):
        locate(repo)


def test_a_fifo_as_exclude_is_refused_and_a_plain_one_is_read(repo: Path) -> None:
    exclude = repo / ".git" / "info" / "exclude"
    exclude.write_text("*.log\n")
    assert locate(repo) is not None
    exclude.unlink()
    os.mkfifo(exclude)
    with pytest.raises(UserError, match="info/exclude"):
        locate(repo)
