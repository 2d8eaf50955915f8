"""``ObjectReader.head``: HEAD's commit and tree from one ``git cat-file``, as ``rev-parse``
reads them, and nothing for a repository with no commit yet (the snapshot's commit binding
asks it of every tree it scans)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from choir.evidence.git import locate


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_head_is_what_rev_parse_reads_and_none_before_the_first_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    found = locate(repo)
    assert found is not None
    with found.objects() as objects:
        assert objects.head() is None
    (repo / "a.txt").write_text("a\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    with found.objects() as objects:
        assert objects.head() == (_git(repo, "rev-parse", "HEAD"),
                                  _git(repo, "rev-parse", "HEAD^{tree}"))
        # the same process still answers other objects after it
        assert objects.commit_tree(_git(repo, "rev-parse", "HEAD")) == \
            _git(repo, "rev-parse", "HEAD^{tree}")


def test_a_fifo_in_place_of_an_object_fails_within_the_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 18a F2: an executor replaced HEAD's loose object with a FIFO; ``git cat-file
    --batch`` blocked opening it, Choir waited on its answer forever, and ``choir run`` (and
    its ``--resume``) hung with the lease held."""
    import os
    import time

    from choir.evidence import git as git_module
    from choir.exceptions import IntegrityError

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    sha = _git(repo, "rev-parse", "HEAD")
    loose = repo / ".git" / "objects" / sha[:2] / sha[2:]
    loose.unlink()
    os.mkfifo(loose)
    monkeypatch.setattr(git_module, "ASK_S", 1.0)
    found = locate(repo)
    assert found is not None
    began = time.monotonic()
    with pytest.raises(IntegrityError, match="did not answer"), found.objects() as objects:
        objects.head()
    assert time.monotonic() - began < 15


def test_changed_and_entry_read_what_git_reads(tmp_path: Path) -> None:
    """``changed`` lists what ``git diff-tree -r`` lists (files added, removed, changed, a
    folder made a file and back), and reads no folder whose id both trees share; ``entry``
    finds one file by its path."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    for rel, text in {"a.txt": "a", "same/deep/x.txt": "x", "dir/b.txt": "b",
                      "dir/sub/c.txt": "c", "gone/d.txt": "d", "swap": "file"}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (repo / "a.txt").write_text("a2")
    (repo / "dir/sub/c.txt").unlink()
    (repo / "dir/new.txt").write_text("n")
    (repo / "gone/d.txt").unlink()
    (repo / "swap").unlink()
    (repo / "swap").mkdir()
    (repo / "swap/inner.txt").write_text("i")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "two")
    found = locate(repo)
    assert found is not None
    one, two = _git(repo, "rev-parse", "HEAD~1^{tree}"), _git(repo, "rev-parse", "HEAD^{tree}")
    expected = set(_git(repo, "diff-tree", "-r", "--name-only", "HEAD~1", "HEAD").split())
    read: list[str] = []
    with found.objects() as objects:
        real = objects.read
        objects.read = lambda oid, want: (read.append(oid), real(oid, want))[1]  # type: ignore[method-assign]
        assert set(objects.changed(one, two)) == expected
        assert set(objects.changed(two, one)) == expected
        assert set(objects.changed(None, one)) == \
            set(_git(repo, "ls-tree", "-r", "--name-only", "HEAD~1").split())
        read.clear()
        list(objects.changed(one, two))
        assert _git(repo, "rev-parse", "HEAD:same") not in read  # an equal folder: not read
        assert objects.entry(two, "dir/new.txt") == ("f", _git(repo, "rev-parse",
                                                               "HEAD:dir/new.txt"))
        assert objects.entry(two, "swap/inner.txt") is not None
        assert objects.entry(one, "swap/inner.txt") is None  # a file on the way
        assert objects.entry(two, "dir") is None  # a folder is no file
        assert objects.entry(two, "nothing/here.txt") is None
