"""The ``$CHOIR_OUT`` watchdog (``OutWatch``) sees all of the folder, however it is built.

The attacks (review 21b): a step nested 17 folders of 250-character names, walking down by
``chdir`` so its own paths stayed short; past 4,096 bytes of full path the watchdog's
``scandir`` failed with ENAMETOOLONG and skipped everything below, and 54 MiB passed under a
10 MiB cap. And empty files cost no bytes: millions of them passed the byte cap, one inode
each, with ``limits.out_files`` only checked after the step.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from choir.sandbox import base
from choir.sandbox.base import OutWatch, out_tally

MIB = 1 << 20


def deep_folder(out: Path, levels: int = 17, width: int = 250) -> int:
    """A descriptor of the innermost of ``levels`` nested folders (names ``width`` long),
    made by descriptor as the step made them by ``chdir``: its full path is too long."""
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    for level in range(levels):
        name = chr(97 + level) * width
        os.mkdir(name, dir_fd=fd)
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    return fd


def sparse(dir_fd: int, name: str, size: int) -> None:
    """A file of ``size`` bytes that costs no disk (the cap counts its apparent size)."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dir_fd)
    try:
        os.truncate(fd, size)
    finally:
        os.close(fd)


def test_bytes_below_a_path_longer_than_path_max_count_against_the_cap(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fd = deep_folder(out)
    try:
        for n in range(6):
            sparse(fd, f"blob{n}", 9 * MIB)
    finally:
        os.close(fd)
    watch = OutWatch(out, cap_mb=10)
    assert watch.stop(), "54 MiB below a long path passed a 10 MiB cap"
    assert "10 MiB" in watch.reason() and "limits.out_mb" in watch.reason()
    assert base.out_usage(out) > 54 * MIB


def test_a_folder_that_cannot_be_listed_counts_as_over(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Its size is unknown, so it fails closed. (Root lists a mode-000 folder anyway, so
    the refusal a user without root meets is simulated.)"""
    out = tmp_path / "out"
    (out / "locked").mkdir(parents=True)
    locked = os.stat(out / "locked").st_ino
    scandir = os.scandir

    def refusing(path: int) -> object:
        if isinstance(path, int) and os.fstat(path).st_ino == locked:
            raise PermissionError(13, "Permission denied")
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    watch = OutWatch(out, cap_mb=10)
    assert watch.stop()
    assert "cannot be listed" in watch.reason() and "limits.out_mb" in watch.reason()


@pytest.mark.parametrize("kind", ["files", "folders"])
def test_empty_entries_past_out_files_stop_the_step(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for n in range(60):
        if kind == "files":
            (out / f"e{n}").touch()
        else:
            (out / f"e{n}").mkdir()
    watch = OutWatch(out, cap_mb=10, files=50)
    assert watch.stop()
    assert f"more than 50 {kind}" in watch.reason() and "limits.out_files" in watch.reason()


def test_entries_up_to_out_files_pass(tmp_path: Path) -> None:
    """The bound is the collector's: ``out_files`` files (the scratch folders do not tip it)."""
    out = tmp_path / "out"
    base.prepare_out(out)
    for n in range(20):
        (out / f"f{n}").touch()
    assert not OutWatch(out, cap_mb=10, files=20).stop()


def test_a_pass_stops_counting_at_the_cap(tmp_path: Path) -> None:
    """The watchdog never walks (or holds) more than the cap allows, however much is there."""
    out = tmp_path / "out"
    out.mkdir()
    for d in range(20):
        (out / f"d{d}").mkdir()
        for n in range(100):
            (out / f"d{d}" / f"{n}").touch()
    tally = out_tally(out, cap_mb=10, files=50)
    assert tally.over and tally.files == 51 and tally.folders == 20  # of 2,020 entries


def test_too_deep_a_folder_stops_the_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.close(deep_folder(out, levels=base.OUT_DEPTH + 2, width=1))
    watch = OutWatch(out, cap_mb=10)
    assert watch.stop() and "limits.out_depth" in watch.reason()
