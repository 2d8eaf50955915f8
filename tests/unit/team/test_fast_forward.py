"""The merge queue's fast forward, on real git: an item's commit lands as the integration
head itself only when a three-way merge would give exactly its tree (the integration head is
where the item started, and the item's commit has that one parent); anything else is merged.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from choir.evidence.git import GitRepo, locate
from choir.evidence.tree import commit_record, commit_tree_hash
from choir.models.plan import QueueEntry
from choir.team.queue import MergeQueue
from tests.team import committed_repo, git

IDENT = ["-c", "user.email=t@t", "-c", "user.name=t"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return committed_repo(tmp_path / "repo")


def commit(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, *IDENT, "commit", "-qm", name)
    return git(repo, "rev-parse", "HEAD")


def queue(repo: Path, tmp_path: Path) -> MergeQueue:
    found = locate(repo)
    assert isinstance(found, GitRepo)
    return MergeQueue("p", found, tmp_path / "trees")


def test_an_item_on_the_head_it_started_from_lands_as_a_fast_forward(
        repo: Path, tmp_path: Path) -> None:
    """No merge commit; its round still reads a worktree of its own, a checkout of the
    commit: never the item's, where the member may have left files git ignores (a
    ``.venv`` the round would take as the repo's interpreter) that no tree hash covers."""
    (repo / ".gitignore").write_text(".venv/\n")
    start = commit(repo, ".gitignore", ".venv/\n")
    item = commit(repo, "one.txt", "1\n")
    (repo / ".venv" / "bin").mkdir(parents=True)  # the member's, in its own worktree
    (repo / ".venv" / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    q = queue(repo, tmp_path)
    built = q.build(QueueEntry(item="one", commit=item), start, start)
    assert isinstance(built, QueueEntry)
    assert built.head == item and built.base == start and built.status == "verifying"
    assert built.tree == commit_tree_hash(repo, item)
    round_tree = q.worktree("one")
    assert sorted(p.name for p in round_tree.iterdir() if p.name != ".git") == [
        ".gitignore", "base.txt", "one.txt"]
    assert git(round_tree, "rev-parse", "HEAD") == item


def test_an_item_whose_commit_has_another_parent_is_merged_not_fast_forwarded(
        repo: Path, tmp_path: Path) -> None:
    """The member rewound its worktree past the integration head (``git reset``) and
    committed there: landing its commit as the head would drop what the integration head
    holds. A merge keeps it."""
    older = git(repo, "rev-parse", "HEAD")
    start = commit(repo, "merged-before.txt", "kept\n")  # the integration head it started on
    git(repo, "reset", "-q", "--hard", older)  # the member's rewind
    item = commit(repo, "two.txt", "2\n")
    assert commit_record(repo, item) is not None
    assert commit_record(repo, item)[1] == (older,)  # type: ignore[index]
    q = queue(repo, tmp_path)
    built = q.build(QueueEntry(item="two", commit=item), start, start)
    assert isinstance(built, QueueEntry) and built.head != item
    assert commit_record(repo, built.head)[1] == (start, item)  # type: ignore[index]
    assert git(repo, "ls-tree", "--name-only", built.head).split() == [
        "base.txt", "merged-before.txt", "two.txt"]
    assert q.worktree("two").is_dir()
    # the control: what a fast forward would have landed lacks the merged file
    assert "merged-before.txt" not in git(repo, "ls-tree", "--name-only", item).split()


def test_an_item_whose_integration_head_moved_since_it_started_is_merged(
        repo: Path, tmp_path: Path) -> None:
    start = git(repo, "rev-parse", "HEAD")
    item = commit(repo, "one.txt", "1\n")
    git(repo, "reset", "-q", "--hard", start)
    moved = commit(repo, "other.txt", "o\n")  # another item landed meanwhile
    q = queue(repo, tmp_path)
    built = q.build(QueueEntry(item="one", commit=item), moved, start)
    assert isinstance(built, QueueEntry) and built.head not in (item, moved)
    assert commit_record(repo, built.head)[1] == (moved, item)  # type: ignore[index]


def test_a_commit_whose_parent_line_git_would_not_read_is_neither_fast_forwarded_nor_fatal(
        repo: Path, tmp_path: Path) -> None:
    """A member can write its own commit object: one whose ``parent`` line comes after the
    committer is a root commit to git, but read every line as Choir once did, it named the
    integration head as its parent and was fast-forwarded onto the branch, history git says
    is unrelated. Choir now reads parents as git does and refuses the object; the merge git
    then refuses sends the item back, and the plan goes on (it raised, and aborted the
    plan, on every resume)."""
    start = git(repo, "rev-parse", "HEAD")
    tree = git(repo, "rev-parse", "HEAD^{tree}")
    body = (f"tree {tree}\nauthor t <t@t> 0 +0000\ncommitter t <t@t> 0 +0000\n"
            f"parent {start}\n\ncrafted\n")
    crafted = subprocess.run(["git", "-C", str(repo), "hash-object", "-t", "commit",
                              "--literally", "-w", "--stdin"], input=body, text=True,
                             capture_output=True, check=True).stdout.strip()
    assert git(repo, "rev-list", "--parents", "-n", "1", crafted) == crafted  # git: a root
    assert commit_record(repo, crafted) is None
    q = queue(repo, tmp_path)
    built = q.build(QueueEntry(item="x", commit=crafted), start, start)
    assert isinstance(built, str) and "refused" in built, built
    assert not q.worktree("x").exists()


def test_the_integration_branch_checked_out_by_a_person_is_never_moved(
        repo: Path, tmp_path: Path) -> None:
    """Landing moved the integration branch with ``update-ref`` even while a person had it
    checked out (to look at the plan's work): their checkout's HEAD moved under them, and
    ``git status`` showed the merge reversed (a review's suspicion). The plan stops instead,
    saying where and what to do; the branch stays."""
    from choir.exceptions import UserError
    from choir.team.queue import integration_branch

    start = git(repo, "rev-parse", "HEAD")
    branch = integration_branch("p")
    git(repo, "branch", branch, start)
    look = tmp_path / "look"
    git(repo, "worktree", "add", "-q", str(look), branch)
    item = commit(repo, "one.txt", "1\n")
    q = queue(repo, tmp_path)
    built = q.build(QueueEntry(item="one", commit=item), start, start)
    assert isinstance(built, QueueEntry)
    assert q.git.checked_out(branch) == [look.resolve()]
    with pytest.raises(UserError, match=f"checked out in {look.resolve()}"):
        q.land(built, start)
    assert git(repo, "rev-parse", branch) == start
    git(look, "switch", "-q", "--detach")
    assert q.git.checked_out(branch) == []
