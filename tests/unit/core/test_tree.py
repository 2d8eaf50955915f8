"""The snapshot verifiers read: exactly the hashed files, sealed, hashed from the bytes copied."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from choir.evidence.tree import (
    commit_tree_hash,
    ensure_snapshot,
    inspect_tree,
    remove_snapshot,
    snapshot,
    tree_hash,
    tree_manifest,
)
from choir.exceptions import IntegrityError, UserError


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                           *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    (path / "pkg").mkdir(parents=True)
    (path / "pkg" / "mod.py").write_text("x = 1\n")
    (path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(path / "run.sh", 0o755)
    (path / "link.py").symlink_to("pkg/mod.py")
    (path / ".gitignore").write_text("ignored.txt\n__pycache__/\n")
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "one")
    return path


def listing(root: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            p = Path(dirpath, name)
            st = p.lstat()
            kind = "l" if stat.S_ISLNK(st.st_mode) else "f"
            out[str(p.relative_to(root))] = (kind, stat.S_IMODE(st.st_mode))
    return out


def test_snapshot_holds_exactly_the_hashed_files_sealed(repo: Path, tmp_path: Path) -> None:
    (repo / "ignored.txt").write_text("hidden\n")
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"stale")
    (repo / "new.py").write_text("untracked, not ignored\n")
    snap = snapshot(repo, tmp_path / "snaps")
    assert snap.path == tmp_path / "snaps" / snap.tree_hash
    assert snap.tree_hash == tree_hash(repo)
    files = listing(snap.path)
    assert set(files) == {".gitignore", "pkg/mod.py", "run.sh", "link.py", "new.py"}
    assert files["run.sh"][1] == 0o555 and files["pkg/mod.py"][1] == 0o444
    assert os.readlink(snap.path / "link.py") == "pkg/mod.py"
    assert stat.S_IMODE((snap.path / "pkg").stat().st_mode) == 0o555
    # a copy, not a link: writing the live file later cannot reach the snapshot
    assert (snap.path / "pkg/mod.py").stat().st_ino != (repo / "pkg/mod.py").stat().st_ino
    (repo / "pkg" / "mod.py").write_text("x = 2\n")
    assert (snap.path / "pkg/mod.py").read_text() == "x = 1\n"
    assert tree_hash(snap.path) != tree_hash(repo)
    assert [p.name for p in (tmp_path / "snaps").iterdir()] == [snap.tree_hash]
    remove_snapshot(snap.path)
    assert list((tmp_path / "snaps").iterdir()) == []


def test_a_symlink_out_of_the_tree_is_refused_and_nothing_is_left(repo: Path,
                                                                 tmp_path: Path) -> None:
    (repo / "escape").symlink_to("/etc/passwd")
    with pytest.raises(UserError, match="escape.*outside the repo"):
        snapshot(repo, tmp_path / "snaps")
    assert list((tmp_path / "snaps").iterdir()) == []
    (repo / "escape").unlink()
    (repo / "up").symlink_to("../../outside")
    with pytest.raises(UserError, match="outside the repo"):
        snapshot(repo, tmp_path / "snaps")


def test_a_link_chain_out_of_the_tree_is_refused(repo: Path, tmp_path: Path) -> None:
    """Review 14, F1: each link looked inside by its text (``d -> .``, ``x -> d/../s``
    normalises to the tree's own ``s``), but the kernel resolves ``d`` before climbing, so
    ``x`` read a file beside the snapshot, in no tree hash. A ``..`` after a name is refused
    now; ``..`` first (up the link's real folders) still works."""
    (repo / "d").symlink_to(".")
    (repo / "x").symlink_to("d/../secret.txt")
    with pytest.raises(UserError, match=r"x is a symlink to d/\.\./secret.txt, which climbs"):
        snapshot(repo, tmp_path / "snaps")
    assert list((tmp_path / "snaps").iterdir()) == []
    (repo / "x").unlink()
    (repo / "pkg" / "up").symlink_to("../run.sh")  # '..' first: stays inside
    snap = snapshot(repo, tmp_path / "snaps")
    assert snap.path is not None and os.readlink(snap.path / "pkg" / "up") == "../run.sh"


def test_a_folder_whose_name_is_a_tree_but_holds_a_folder_link_more_is_not_that_tree(
        repo: Path, tmp_path: Path) -> None:
    """Review 14, F2: the whole re-hash of a snapshot folder skipped links to folders, so a
    folder with the tree's files plus ``pkg2 -> elsewhere`` (a package Python imports first)
    passed as the tree; and a PARANOID tree holding a folder link never passed its own
    check. FIFOs are refused too."""
    from choir.evidence.tree import _holds

    (repo / "latest").symlink_to("pkg")  # a folder link the tree itself has
    snap = snapshot(repo, tmp_path / "snaps", full=True)
    assert snap.path is not None and (snap.path / "latest").is_symlink()
    assert _holds(snap.path, snap.tree_hash, full=True)  # PARANOID's own check passes
    planted = tmp_path / "planted"
    shutil.copytree(snap.path, planted, symlinks=True)
    assert _holds(planted, snap.tree_hash, full=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (planted / "pkg2").symlink_to(elsewhere)
    assert not _holds(planted, snap.tree_hash, full=True)
    (planted / "pkg2").unlink()
    os.mkfifo(planted / "pipe")
    assert not _holds(planted, snap.tree_hash, full=True)
    (planted / "pipe").unlink()
    deep = planted.joinpath(*["d"] * 300)  # past the scan's bound: not the tree, no error
    deep.mkdir(parents=True)
    assert not _holds(planted, snap.tree_hash, full=True)


def test_commit_only_when_the_tree_is_exactly_head(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD").strip()
    assert inspect_tree(repo).commit_sha == head
    (repo / "ignored.txt").write_text("ignored files are not in the verified tree\n")
    assert inspect_tree(repo).commit_sha == head
    (repo / "pkg" / "mod.py").write_text("x = 2\n")
    assert inspect_tree(repo).commit_sha is None  # modified
    git(repo, "checkout", "--", "pkg/mod.py")
    (repo / "extra.py").write_text("")
    assert inspect_tree(repo).commit_sha is None  # untracked, not ignored
    (repo / "extra.py").unlink()
    os.chmod(repo / "run.sh", 0o644)
    assert inspect_tree(repo).commit_sha is None  # mode changed
    os.chmod(repo / "run.sh", 0o755)
    (repo / "pkg" / "mod.py").unlink()
    assert inspect_tree(repo).commit_sha is None  # deleted
    git(repo, "checkout", "--", "pkg/mod.py")
    assert inspect_tree(repo).commit_sha == head


def test_outside_git_there_is_no_commit(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("a\n")
    snap = inspect_tree(tmp_path)
    assert snap.commit_sha is None and snap.files == 1


def test_the_sha256_digest_is_over_the_canonical_manifest(repo: Path) -> None:
    manifest = tree_manifest(repo)
    assert hashlib.sha256(manifest).hexdigest() == inspect_tree(repo).sha256
    mod = hashlib.sha256(b"x = 1\n").hexdigest()
    assert f"f {mod} pkg/mod.py\0".encode() in manifest
    assert b"x " in manifest and b"l " in manifest


def test_ensure_snapshot_reuses_recopies_or_refuses(repo: Path, tmp_path: Path) -> None:
    root = tmp_path / "snaps"
    recorded = tree_hash(repo)
    first = ensure_snapshot(repo, recorded, root)
    assert ensure_snapshot(repo, recorded, root) == first  # reused, not copied again
    remove_snapshot(first)
    assert ensure_snapshot(repo, recorded, root) == first  # re-copied: same tree
    remove_snapshot(first)
    (repo / "pkg" / "mod.py").write_text("x = 2\n")  # the tree changed after it was hashed
    with pytest.raises(IntegrityError, match="changed since it was hashed"):
        ensure_snapshot(repo, recorded, root)
    assert list(root.iterdir()) == []


def test_commit_tree_hash_is_the_clean_checkouts_tree_hash(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD").strip()
    assert commit_tree_hash(repo, head) == tree_hash(repo)
    (repo / "pkg" / "mod.py").write_text("x = 2\n")
    assert commit_tree_hash(repo, head) != tree_hash(repo)
    assert commit_tree_hash(repo, "0" * 40) is None


def test_commit_tree_hash_reads_a_full_commit_id_with_no_rev_parse(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit's full id (what the plan driver and the gate pass) is read as a commit
    directly; a name, or the full id of an annotated tag, still goes through rev-parse and
    reads as before; the id of anything else is no commit."""
    from choir.evidence.git import GitRepo

    head, expected = git(repo, "rev-parse", "HEAD").strip(), tree_hash(repo)
    git(repo, "tag", "-a", "-m", "t", "v1")
    tag = git(repo, "rev-parse", "v1").strip()  # the tag object's own id
    assert tag != head
    assert commit_tree_hash(repo, "v1") == commit_tree_hash(repo, tag) == expected
    assert commit_tree_hash(repo, git(repo, "rev-parse", "HEAD:pkg/mod.py").strip()) is None
    asked: list[str] = []
    rev = GitRepo.rev
    monkeypatch.setattr(GitRepo, "rev", lambda self, r: asked.append(r) or rev(self, r))
    assert commit_tree_hash(repo, head) == expected
    assert asked == []


def test_a_commits_record_is_read_once_and_only_for_its_own_repository(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record of a full commit id is kept (the driver asks for it three times an item),
    and only for the repository it was read in: a clone that lacks the commit, or holds other
    bytes under a name, is read afresh."""
    from choir.evidence.git import ObjectReader
    from choir.evidence.tree import commit_record, commit_submodules

    head, expected = git(repo, "rev-parse", "HEAD").strip(), tree_hash(repo)
    readers: list[object] = []
    made = ObjectReader.__init__
    monkeypatch.setattr(ObjectReader, "__init__",
                        lambda self, r: readers.append(r) or made(self, r))
    assert commit_submodules(repo, head) == [{}]  # reads the commit, and keeps its record
    assert commit_record(repo, head) == (expected, ())
    assert commit_tree_hash(repo, head) == expected and len(readers) == 1
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    assert commit_tree_hash(other, head) is None and len(readers) == 2


def test_a_directory_planted_under_the_trees_name_is_never_verified(repo: Path,
                                                                   tmp_path: Path) -> None:
    """An executor can compute the buggy tree's hash and plant a fixed copy under it."""
    root = tmp_path / "snaps"
    recorded = tree_hash(repo)
    planted = root / recorded
    (planted / "pkg").mkdir(parents=True)
    (planted / "pkg" / "mod.py").write_text("x = 'patched'\n")
    assert ensure_snapshot(repo, recorded, root) == planted
    assert (planted / "pkg" / "mod.py").read_text() == "x = 1\n"  # replaced by a real copy
    remove_snapshot(planted)
    (planted / "pkg").mkdir(parents=True)
    (planted / "pkg" / "mod.py").write_text("x = 'patched'\n")
    snap = snapshot(repo, root)
    assert snap.path == planted and (planted / "pkg" / "mod.py").read_text() == "x = 1\n"
    assert [p.name for p in root.iterdir()] == [recorded]
