"""``GitRepo.head_commit``: HEAD's commit read from git's own files after a commit, with no
process; every case that is not the plain one (a branch whose ref is a loose file holding a
full id) asks git, and gets git's answer."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from choir.evidence.git import GitRepo, locate
from tests.team import committed_repo


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    found = locate(committed_repo(tmp_path / "repo"))
    assert found is not None
    return found


def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    rev = GitRepo.rev

    def counted(self: GitRepo, name: str) -> Any:
        calls.append(name)
        return rev(self, name)

    monkeypatch.setattr(GitRepo, "rev", counted)
    return calls


def test_a_branch_just_committed_is_read_from_its_ref_file(
        repo: GitRepo, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = asked(monkeypatch)
    assert repo.head_commit() == git(repo.root, "rev-parse", "HEAD")
    assert calls == []


@pytest.mark.parametrize("case", ["detached", "packed", "HEAD a link", "ref a link",
                                  "ref leaves refs/", "ref not an id"])
def test_anything_but_the_plain_case_is_asked_of_git(
        repo: GitRepo, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str) -> None:
    head = git(repo.root, "rev-parse", "HEAD")
    ref = repo.common_dir / "refs" / "heads" / "main"
    if case == "detached":
        git(repo.root, "checkout", "-q", "--detach")
    elif case == "packed":
        git(repo.root, "pack-refs", "--all")
        assert not ref.exists()
    elif case == "HEAD a link":
        (tmp_path / "elsewhere").write_text("ref: refs/heads/main\n")
        (repo.git_dir / "HEAD").unlink()
        (repo.git_dir / "HEAD").symlink_to(tmp_path / "elsewhere")
    elif case == "ref a link":
        (tmp_path / "forged").write_text("f" * 40 + "\n")
        ref.unlink()
        ref.symlink_to(tmp_path / "forged")
    elif case == "ref leaves refs/":
        (repo.git_dir / "HEAD").write_text("ref: refs/heads/../../config\n")
    elif case == "ref not an id":
        ref.write_text("not an id\n")
    calls = asked(monkeypatch)
    got = repo.head_commit()
    assert calls == ["HEAD"]
    assert got == repo.rev("HEAD")
    if case in ("detached", "packed"):
        assert got == head
