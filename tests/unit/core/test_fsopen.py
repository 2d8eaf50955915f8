"""``choir._core.fsopen``: a link anywhere on a path fails the open, it is never followed."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from choir._core import fsopen


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("SECRET")
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("inside")
    os.symlink(outside, root / "a" / "lnk")
    os.symlink(outside / "secret", root / "a" / "b" / "file-link")
    os.mkfifo(root / "a" / "fifo")
    return root, outside


def test_read_bytes_refuses_links_as_folder_or_file_and_special_files(tmp_path: Path) -> None:
    root, outside = _tree(tmp_path)
    assert (root / "a" / "lnk" / "secret").read_text() == "SECRET"  # the control
    assert fsopen.read_bytes(root, "a/b/f", 100) == b"inside"
    for rel in ("a/lnk/secret", "a/b/file-link"):
        with pytest.raises(OSError) as err:
            fsopen.read_bytes(root, rel, 100)
        assert err.value.errno in (errno.ELOOP, errno.ENOTDIR)
    with pytest.raises(OSError) as err:
        fsopen.read_bytes(root, "a/fifo", 100)  # would block forever if opened blocking
    assert err.value.errno == errno.EINVAL
    for bad in ("../outside/secret", "/etc/passwd", "a/../a/b/f", ""):
        with pytest.raises(OSError):
            fsopen.read_bytes(root, bad, 100)


def test_cursor_reuses_the_open_chain_and_refuses_a_link_on_the_way(tmp_path: Path) -> None:
    root, _ = _tree(tmp_path)
    with fsopen.DirCursor(root) as cursor:
        first = cursor.dir(["a", "b"])
        assert cursor.dir(["a", "b"]) == first
        assert "f" in os.listdir(cursor.dir(["a", "b"]))
        with pytest.raises(OSError):
            cursor.dir(["a", "lnk"])
    (tmp_path / "copy").mkdir()
    with fsopen.DirCursor(tmp_path / "copy", create=True) as made:
        made.dir(["x", "y"])
    assert (tmp_path / "copy" / "x" / "y").is_dir()


def test_walk_lists_links_without_entering_them_and_bounds_depth(tmp_path: Path) -> None:
    root, _ = _tree(tmp_path)
    rels = [e.rel for e in fsopen.walk(root)]
    assert rels == ["a", "a/b", "a/b/f", "a/b/file-link", "a/fifo", "a/lnk"]
    deep = tmp_path / "deep"
    (deep / "1" / "2" / "3").mkdir(parents=True)
    assert len(list(fsopen.walk(deep, max_depth=3))) == 3
    with pytest.raises(fsopen.TooDeep):
        list(fsopen.walk(deep, max_depth=2))


def test_after_a_refused_folder_the_cursor_never_hands_out_a_stale_descriptor(
        tmp_path: Path) -> None:
    """A path refused halfway leaves a partial chain: the root asked for next must be the
    root, not the last folder opened (a scan once read ``calc.py`` from ``a/b``)."""
    root, _ = _tree(tmp_path)
    (root / "top").write_text("at the root")
    with fsopen.DirCursor(root) as cursor:
        assert "top" in os.listdir(cursor.dir([]))
        with pytest.raises(OSError):
            cursor.dir(["a", "lnk", "deeper"])
        assert "top" in os.listdir(cursor.dir([]))
        with pytest.raises(OSError):
            cursor.dir(["a", "b", "missing"])
        assert "f" in os.listdir(cursor.dir(["a", "b"]))


@pytest.mark.parametrize("slow_s", [1.0, 0.0], ids=["quick calls: here", "slow: threads"])
def test_lstat_many_walks_by_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        slow_s: float) -> None:
    """The same answers whether the calls stay in this thread (quick: cached inodes) or are
    spread over threads (slow: read from disk; every call counts as slow here)."""
    monkeypatch.setattr(fsopen, "_SLOW_S", slow_s)
    spread = []
    real_thread = fsopen.threading.Thread

    def thread(*args: Any, **kw: Any) -> threading.Thread:
        spread.append(1)
        return real_thread(*args, **kw)

    monkeypatch.setattr(fsopen.threading, "Thread", thread)
    root, _ = _tree(tmp_path)
    rels = [*(f"a/b/m{i}" for i in range(300)), "a/b/f", "a/b/file-link", "a/lnk/secret",
            "a/missing", *(f"a/b/n{i}" for i in range(5000))]
    for i in range(5000):
        (root / "a" / "b" / f"n{i}").write_text("")
        if i < 300:
            (root / "a" / "b" / f"m{i}").write_text("m")
    found = fsopen.lstat_many(root, rels, workers=3)
    assert bool(spread) == (slow_s == 0.0)
    assert all(not isinstance(st, OSError) and st.st_size == 1 for st in found[:300])
    at = found[300:]
    assert not isinstance(at[0], OSError) and at[0].st_size == len("inside")
    assert not isinstance(at[1], OSError) and stat.S_ISLNK(at[1].st_mode)
    assert isinstance(at[2], OSError) and at[2].errno in (errno.ELOOP, errno.ENOTDIR)
    assert isinstance(at[3], FileNotFoundError)
    assert all(not isinstance(st, OSError) and st.st_size == 0 for st in at[4:])


def test_lstat_many_of_nothing_opens_nothing(tmp_path: Path) -> None:
    assert fsopen.lstat_many(tmp_path / "missing", []) == []
