"""What the plan driver's process keeps of git between calls (``choir plan run`` turns the
warm caches on): one ``git cat-file`` per repository, and an item's commit read from its
branch's file. Each must answer exactly what a fresh git process would."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from choir._core import warm
from choir.evidence import git as gitmod
from choir.evidence.git import GitRepo, locate
from choir.exceptions import IntegrityError

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str, data: bytes | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                           *args], check=True, capture_output=True, input=data
                          ).stdout.decode().strip()


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    path = tmp_path / "repo"
    path.mkdir()
    (path / "a.txt").write_text("a\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "base")
    found = locate(path)
    assert found is not None
    return found


@pytest.fixture
def warm_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(warm, "_enabled", True)
    yield
    gitmod._end_kept()


def _process(reader: gitmod.ObjectReader) -> int | None:
    started = reader._started
    return started.pid if started is not None else None


def test_one_reader_is_kept_and_finds_objects_written_after_it_started(
        repo: GitRepo, warm_on: None) -> None:
    blob = git(repo.root, "rev-parse", "HEAD:a.txt")
    with repo.kept_objects() as first:
        assert first.read(blob, "blob") == b"a\n"
        pid = _process(first)
    new = git(repo.root, "hash-object", "-w", "--stdin", data=b"written later\n")
    with repo.kept_objects() as again:
        assert again is first and _process(again) == pid  # the same git process
        assert again.read(new, "blob") == b"written later\n"
    git(repo.root, "repack", "-adq")  # now only in a pack made after the reader started
    git(repo.root, "prune-packed")
    with repo.kept_objects() as packed:
        assert packed.read(blob, "blob") == b"a\n" and _process(packed) == pid


def test_a_block_that_raised_ends_the_reader_and_the_next_starts_afresh(
        repo: GitRepo, warm_on: None) -> None:
    """A question that failed may leave the rest of an object in the pipe: the reader is
    ended, and the next block's first question starts git again."""
    blob = git(repo.root, "rev-parse", "HEAD:a.txt")
    with pytest.raises(IntegrityError), repo.kept_objects() as reader:
        pid = (reader.read(blob, "blob"), _process(reader))[1]
        reader.read(blob, "commit")  # the wrong type: its bytes are left unread
    assert _process(reader) is None
    with repo.kept_objects() as next_one:
        assert next_one.read(blob, "blob") == b"a\n" and _process(next_one) != pid


def test_a_second_thread_and_a_cold_process_get_readers_of_their_own(
        repo: GitRepo, warm_on: None, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = git(repo.root, "rev-parse", "HEAD:a.txt")
    seen: list[object] = []
    with repo.kept_objects() as held:
        held.read(blob, "blob")

        def other() -> None:
            with repo.kept_objects() as own:
                seen.append((own is held, own.read(blob, "blob")))

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen == [(False, b"a\n")]
    monkeypatch.setattr(warm, "_enabled", False)
    with repo.kept_objects() as cold:
        assert cold is not held
    assert _process(cold) is None  # ended with its block


def test_a_fork_never_asks_its_parents_reader(repo: GitRepo, warm_on: None) -> None:
    blob = git(repo.root, "rev-parse", "HEAD:a.txt")
    with repo.kept_objects() as parent:
        parent.read(blob, "blob")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            with repo.kept_objects() as child:
                ok = child is not parent and child.read(blob, "blob") == b"a\n"
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    with repo.kept_objects() as after:  # the parent's pipe was never touched by the child
        assert after is parent and after.read(blob, "blob") == b"a\n"


def test_an_items_commit_is_read_from_its_branch_file_as_git_reads_it(
        repo: GitRepo, tmp_path: Path) -> None:
    work = repo.add_worktree(tmp_path / "wt", "choir/plan/p/item/x", "main")
    (work.root / "b.txt").write_text("b\n")
    work.write("add", "-A")
    work.write("commit", "-qm", "x")
    assert work.head_commit() == work.rev("HEAD") != repo.rev("main")
    git(repo.root, "pack-refs", "--all")  # no loose file left: git is asked
    assert not (repo.common_dir / "refs/heads/choir/plan/p/item/x").exists()
    assert work.head_commit() == work.rev("HEAD")
    git(repo.root, "symbolic-ref", "refs/heads/choir/plan/p/item/x", "refs/heads/main")
    assert work.head_commit() == work.rev("HEAD") == repo.rev("main")  # a chain: git's
    detached = repo.add_worktree(tmp_path / "head", None, repo.rev("main") or "")
    assert detached.head_commit() == repo.rev("main")
    assert "detached" in git(repo.root, "worktree", "list", "--porcelain")
