"""What an executor wrote is never a later run's pinned check until a person vouches for it
(``choir.evidence.leftovers``; the whole attack: ``test_spec_attacks``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from choir._core.canonical import blake3_hex
from choir.evidence import leftovers
from choir.exceptions import UserError

PLANT = b"def pytest_runtest_makereport(item, call): ...\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    (path / "test_a.py").write_text("def test_a(): pass\n")
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "base")
    return path


def pinned(repo: Path, *rels: str) -> tuple[dict[str, tuple[str, str]], dict[str, bytes]]:
    bodies = {blake3_hex(b): b for b in ((repo / r).read_bytes() for r in rels)}
    return {r: ("f", blake3_hex((repo / r).read_bytes())) for r in rels}, bodies


def check(repo: Path, *rels: str) -> None:
    files, bodies = pinned(repo, *rels)
    leftovers.check(repo, files, bodies.__getitem__)


def test_a_file_an_executor_wrote_is_pinned_only_once_a_person_commits_it(repo: Path) -> None:
    (repo / "conftest.py").write_bytes(PLANT)
    leftovers.begin(repo, "r1")
    leftovers.record(repo, "r1", {"conftest.py": blake3_hex(PLANT)})
    with pytest.raises(UserError, match="an executor wrote these.*conftest.py"):
        check(repo, "test_a.py", "conftest.py")
    check(repo, "test_a.py")  # not pinned (removed, or outside the spec): nothing to refuse
    (repo / "conftest.py").write_bytes(PLANT + b"# reviewed\n")  # a person's edit: theirs
    check(repo, "test_a.py", "conftest.py")
    (repo / "conftest.py").write_bytes(PLANT)
    git(repo, "add", "conftest.py")
    git(repo, "commit", "-qm", "vouched")
    check(repo, "test_a.py", "conftest.py")


def test_a_commit_the_executor_left_vouches_for_nothing(repo: Path) -> None:
    """An executor that writes ``.git`` commits its own plant: HEAD holds it, but HEAD is
    the commit its round recorded."""
    leftovers.begin(repo, "r1")
    (repo / "conftest.py").write_bytes(PLANT)
    git(repo, "add", "conftest.py")
    git(repo, "commit", "-qm", "the executor's")
    leftovers.record(repo, "r1", {"conftest.py": blake3_hex(PLANT)})
    with pytest.raises(UserError, match="conftest.py"):
        check(repo, "test_a.py", "conftest.py")


def test_a_run_stopped_before_its_record_refuses_every_change_from_head(repo: Path) -> None:
    leftovers.begin(repo, "r1")  # killed before its round recorded anything
    (repo / "conftest.py").write_bytes(PLANT)
    with pytest.raises(UserError, match="run r1 stopped before"):
        check(repo, "test_a.py", "conftest.py")
    check(repo, "test_a.py")  # the spec as HEAD has it: nothing left; the pending run ends
    check(repo, "test_a.py", "conftest.py")


def test_a_persons_commit_on_top_of_the_executors_vouches_for_nothing(repo: Path) -> None:
    """Review 21d: HEAD is a person's commit, but the plant's newest change is the
    executor's; the refusal names that commit."""
    leftovers.begin(repo, "r1")
    (repo / "conftest.py").write_bytes(PLANT)
    git(repo, "add", "conftest.py")
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=dev", "-c", "user.email=d@d",
                    "commit", "-qm", "test setup"], check=True)
    planted = git(repo, "rev-parse", "HEAD")
    leftovers.record(repo, "r1", {"conftest.py": blake3_hex(PLANT)})
    (repo / "README").write_text("docs\n")
    git(repo, "add", "README")
    git(repo, "commit", "-qm", "a person's")
    with pytest.raises(UserError, match=f"conftest.py \\(commit {planted[:12]} by dev <d@d>"):
        check(repo, "test_a.py", "conftest.py")
    (repo / "conftest.py").write_bytes(PLANT + b"# reviewed\n")  # a person's own commit of it
    git(repo, "commit", "-qam", "reviewed")
    check(repo, "test_a.py", "conftest.py")


def test_a_run_killed_after_its_executor_committed_vouches_for_nothing(repo: Path) -> None:
    """Review 21d: no record, the tree clean, HEAD the executor's own commit."""
    leftovers.begin(repo, "r1")
    (repo / "conftest.py").write_bytes(PLANT)
    git(repo, "add", "conftest.py")
    git(repo, "commit", "-qm", "the executor's")
    with pytest.raises(UserError, match="run r1 stopped before.*conftest.py \\(commit"):
        check(repo, "test_a.py", "conftest.py")
    check(repo, "test_a.py")  # the base's own file: a commit before the run began
    with pytest.raises(UserError, match="conftest.py \\(commit"):  # and it stays the executor's
        check(repo, "test_a.py", "conftest.py")


def test_an_item_file_must_be_heads_and_no_executors(repo: Path) -> None:
    item = repo / "item.yaml"
    item.write_text("id: a\n")
    with pytest.raises(UserError, match="(?s)differs from HEAD.*commit it.*outside the repo"):
        leftovers.check_item(repo, item)
    git(repo, "add", "item.yaml")
    git(repo, "commit", "-qm", "item")
    leftovers.check_item(repo, item)
    leftovers.begin(repo, "r1")
    item.write_text("id: a\nmood: CALM\n")
    git(repo, "commit", "-qam", "the executor's")
    with pytest.raises(UserError, match="an executor committed it"):
        leftovers.check_item(repo, item)


def test_only_the_files_an_executors_commit_changed_are_walked(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once an executor's commit is recorded, a run's start walks the history of the
    pinned files that commit changed, not of every pinned file (300 here: one ``git
    rev-list`` each, every run, on a tree of thousands of checks)."""
    from choir.evidence.git import GitRepo

    for i in range(300):
        (repo / f"test_{i}.py").write_text(f"def test_{i}(): pass\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a person's tests")
    leftovers.begin(repo, "r1")
    (repo / "test_7.py").write_bytes(PLANT)
    git(repo, "commit", "-qam", "the executor's")
    leftovers.record(repo, "r1", {"test_7.py": blake3_hex(PLANT)})
    walks: list[tuple[str, ...]] = []
    real = GitRepo.run

    def run(self: GitRepo, *args: str, timeout: float = 60) -> bytes | None:
        if "rev-list" in args and "-1" in args:
            walks.append(args)
        return real(self, *args, timeout=timeout)

    monkeypatch.setattr(GitRepo, "run", run)
    rels = ["test_a.py", *(f"test_{i}.py" for i in range(300))]
    with pytest.raises(UserError, match="test_7.py \\(commit"):
        check(repo, *rels)
    assert [w[-1] for w in walks] == ["test_7.py"]
    (repo / "test_7.py").write_text("def test_7(): pass\n")  # a person restores it
    git(repo, "commit", "-qam", "restored")
    walks.clear()
    check(repo, *rels)
    assert [w[-1] for w in walks] == ["test_7.py"]
