"""``choir._core.fsopen``: a link anywhere on a path fails the open, it is never followed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

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
