"""The trusted stat cache: unchanged files are not read again; everything that changes a
file's bytes changes its ``lstat`` (ctime above all), and a change within the clock's
granularity (git's racy case) is read again, not served from the cache."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from choir._core import fsopen
from choir.evidence import statcache
from choir.evidence.tree import inspect_tree, remove_snapshot, snapshot


@pytest.fixture
def no_racy_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files made by the test are seconds old at most: trust them at once (the racy rule
    has its own test below, with the real margin)."""
    monkeypatch.setattr(statcache, "RACY_NS", 0)


@pytest.fixture
def opened(repo: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the live files (of ``repo``, not of the store) the scans open."""
    names: list[str] = []
    real = fsopen.open_regular
    live = {os.stat(repo / d).st_ino for d in ("", "pkg", "pkg/deep")}

    def spy(name: str, dir_fd: int) -> tuple[int, os.stat_result]:
        if os.fstat(dir_fd).st_ino in live:
            names.append(name)
        return real(name, dir_fd)

    monkeypatch.setattr(fsopen, "open_regular", spy)
    yield names


def sealed(repo: Path, root: Path, **kw: Any) -> tuple[str, bytes]:
    """A snapshot's tree hash and the bytes of calc.py in it, the snapshot then parked."""
    snap = snapshot(repo, root, **kw)
    assert snap.path is not None
    data = (snap.path / "calc.py").read_bytes()
    remove_snapshot(root)
    return snap.tree_hash, data


def test_a_second_scan_reads_no_unchanged_file(repo: Path, tmp_path: Path, no_racy_wait: None,
                                               opened: list[str]) -> None:
    first, _ = sealed(repo, tmp_path / "snaps")
    assert "calc.py" in opened
    opened.clear()
    second, _ = sealed(repo, tmp_path / "snaps")
    assert second == first
    assert opened == []  # nothing read: every file's lstat matched the cache
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    third, data = sealed(repo, tmp_path / "snaps")
    assert set(opened) == {"calc.py"} and data == b"def add(a, b):\n    return a + b\n"
    assert third == inspect_tree(repo).tree_hash != first


def test_a_same_size_rewrite_with_its_mtime_restored_is_read_again(
        repo: Path, tmp_path: Path, no_racy_wait: None) -> None:
    """The executor's cover-up: new bytes of the same size, then ``touch -d`` back to the
    old mtime. The ctime it cannot set back gives it away."""
    time.sleep(0.01)
    calc = repo / "calc.py"
    before = calc.stat()
    first, _ = sealed(repo, tmp_path / "snaps")
    calc.write_text("def add(a, b):\n    return a + b\n")  # the same size
    os.utime(calc, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = calc.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == \
        (before.st_size, before.st_mtime_ns, before.st_ino)
    assert after.st_ctime_ns != before.st_ctime_ns
    second, data = sealed(repo, tmp_path / "snaps")
    assert data == b"def add(a, b):\n    return a + b\n"
    assert second == inspect_tree(repo).tree_hash != first


def _coarse(st: os.stat_result) -> os.stat_result:
    """``st`` as a file system with two-second timestamps (FAT) reports it."""
    extra = {name: getattr(st, name) for name in
             ("st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_blksize", "st_blocks",
              "st_rdev")}
    for name in ("st_mtime_ns", "st_ctime_ns"):
        extra[name] = extra[name] // 2_000_000_000 * 2_000_000_000
    return os.stat_result(list(st[:10]), extra)


@pytest.fixture
def coarse_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``lstat`` the scan takes of a live file, as a two-second clock would give it."""
    real_open, real_many = fsopen.open_regular, fsopen.lstat_many

    def open_regular(name: str, dir_fd: int) -> tuple[int, os.stat_result]:
        fd, st = real_open(name, dir_fd)
        return fd, _coarse(st)

    def lstat_many(root: str | Path, rels: Any, workers: int = 4) -> list[Any]:
        return [st if isinstance(st, OSError) else _coarse(st)
                for st in real_many(root, rels, workers)]

    monkeypatch.setattr(fsopen, "open_regular", open_regular)
    monkeypatch.setattr(fsopen, "lstat_many", lstat_many)


def _racy_round(repo: Path, root: Path) -> tuple[str, bytes, str] | None:
    """Write, scan, rewrite (same size, same mtime), scan, all inside one two-second tick;
    None when the tick ran out first (the caller tries again)."""
    tick = time.time_ns() // 2_000_000_000
    calc = repo / "calc.py"
    calc.write_text("def add(a, b):\n    return a - b\n")
    sealed(repo, root)
    calc.write_text("def add(a, b):\n    return a + b\n")
    second, data = sealed(repo, root)
    if time.time_ns() // 2_000_000_000 != tick:
        return None
    return second, data, inspect_tree(repo).tree_hash


def _in_one_tick(repo: Path, root: Path) -> tuple[str, bytes, str]:
    for _ in range(20):
        while time.time_ns() % 2_000_000_000 > 300_000_000:  # start at a tick's beginning
            time.sleep(0.02)
        found = _racy_round(repo, root)
        if found is not None:
            return found
    pytest.skip("the machine is too loaded to fit two scans in one two-second tick")


def test_a_change_within_the_clock_tick_is_read_again(repo: Path, tmp_path: Path,
                                                      coarse_clock: None) -> None:
    """git's racy case: with two-second timestamps, a rewrite in the same tick as the scan
    keeps every field of the ``lstat``; the entry was not trusted, so it is read again."""
    second, data, live = _in_one_tick(repo, tmp_path / "snaps")
    assert data == b"def add(a, b):\n    return a + b\n"
    assert second == live


def test_without_the_racy_rule_the_stale_hash_would_be_served(
        repo: Path, tmp_path: Path, coarse_clock: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the test above: with the rule off (no margin), the cache serves the
    first bytes' hash for the rewritten file."""
    monkeypatch.setattr(statcache, "RACY_NS", 0)
    served = []
    for attempt in range(3):  # a round whose base or object the store let go (a pool
        # eviction on a loaded machine) reads the file afresh, which is safe: the hazard is
        # shown by any round that serves the stale hash (one, nearly always the first)
        second, data, live = _in_one_tick(repo, tmp_path / f"snaps{attempt}")
        served.append(data)
        if data == b"def add(a, b):\n    return a - b\n":  # the stale bytes, not the live
            assert second != live
            return
    pytest.fail(f"no round served the stale hash: {served}")


def test_paranoid_reads_every_file_and_ignores_a_poisoned_cache(
        repo: Path, tmp_path: Path, no_racy_wait: None, opened: list[str]) -> None:
    """A cache edited by a process with the caller's uid (outside any sandbox) names the old
    bytes for the new file, with the new file's ``lstat``: the stat scan is fooled (the
    residual docs/security.md names), ``full`` (PARANOID) is not."""
    calc = repo / "calc.py"
    old_hash, _ = sealed(repo, tmp_path / "snaps")
    store = tmp_path / "choir-home" / "artifacts" / "trees"
    key = statcache.repo_key(repo)
    calc.write_text("def add(a, b):\n    return a + b\n")
    table = statcache.StatCache(store / "stat" / key, 40)
    row = table._old["calc.py"]
    poisoned = (*statcache.stamp(os.lstat(calc)), *row[6:])
    table._table.save({"calc.py": poisoned})  # type: ignore[union-attr]
    fooled, data = sealed(repo, tmp_path / "snaps")
    assert fooled == old_hash and data == b"def add(a, b):\n    return a - b\n"
    opened.clear()
    immune, data = sealed(repo, tmp_path / "snaps", full=True)
    assert set(opened) == {"calc.py", "run.sh", "leaf.py", *(f"m{n}.py" for n in range(20))}
    assert data == b"def add(a, b):\n    return a + b\n"
    assert immune == inspect_tree(repo).tree_hash != old_hash


def test_a_sparse_file_past_the_limit_is_refused_before_it_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 18a F1: ``truncate -s 2G big.bin`` costs the executor nothing, and the seal
    read it three times and wrote 2 GiB into the store (a bigger one fills the host's
    disk). Past ``CHOIR_MAX_FILE_MB`` (or the tree past ``CHOIR_MAX_TREE_MB``) the tree is
    refused, nothing read or written."""
    from choir.exceptions import UserError

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("A = 1\n")
    with open(repo / "big.bin", "wb") as fh:
        fh.truncate(3 << 30)
    began = time.monotonic()
    with pytest.raises(UserError, match="CHOIR_MAX_FILE_MB"):
        snapshot(repo, tmp_path / "snaps")
    assert time.monotonic() - began < 10
    os.truncate(repo / "big.bin", 3 << 20)
    monkeypatch.setenv("CHOIR_MAX_TREE_MB", "2")
    with pytest.raises(UserError, match="CHOIR_MAX_TREE_MB"):
        inspect_tree(repo)
    monkeypatch.setenv("CHOIR_MAX_TREE_MB", "4")
    assert inspect_tree(repo).files == 2
