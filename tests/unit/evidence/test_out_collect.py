"""Collecting ``$CHOIR_OUT`` holds it to its bounds by descriptor, and keeps nothing over them.

The attacks (review 21b): folders nested past PATH_MAX hid 54 MiB from the byte cap, and the
collector, walking by descriptor, stored all of it; a step over ``limits.out_files`` had its
``out/`` set aside under ``aborted/`` for good (4 million inodes a run).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from choir.evidence.collect import OutBounds, discard, seal

MIB = 1 << 20


def ingest(dir_fd: int, name: str) -> str:
    return name


def run_folder(tmp_path: Path) -> Path:
    base = tmp_path / "run"
    (base / "out").mkdir(parents=True)
    (base / "logs").mkdir()
    (base / "logs" / "combined.log").write_text("log\n")
    return base


def nested(root: Path, levels: int, width: int) -> int:
    """A descriptor of the innermost of ``levels`` folders under ``root``, made by
    descriptor (the full path may be longer than PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for level in range(levels):
        name = chr(97 + level % 26) * width
        os.mkdir(name, dir_fd=fd)
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    return fd


def test_bytes_below_a_long_path_are_refused_past_out_mb(tmp_path: Path) -> None:
    base = run_folder(tmp_path)
    fd = nested(base / "out", 17, 250)
    try:
        for n in range(6):
            blob = os.open(f"blob{n}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
            os.truncate(blob, 9 * MIB)
            os.close(blob)
    finally:
        os.close(fd)
    sealed = seal(base, OutBounds(mb=10), tmp_path / "aborted", ingest)
    assert sealed.exceeded and "limits.out_mb exceeded" in sealed.exceeded
    assert list(sealed.files) == ["logs/combined.log"]


def test_bytes_within_out_mb_are_kept(tmp_path: Path) -> None:
    base = run_folder(tmp_path)
    (base / "out" / "small").write_bytes(b"x" * 1000)
    sealed = seal(base, OutBounds(mb=1), tmp_path / "aborted", ingest)
    assert sealed.exceeded is None and "out/small" in sealed.files


def test_an_out_folder_over_its_bounds_is_removed_not_kept(tmp_path: Path) -> None:
    base = run_folder(tmp_path)
    for n in range(30):
        (base / "out" / f"e{n}").touch()
    (base / "out" / "link").symlink_to(tmp_path / "keep")
    (tmp_path / "keep").write_text("not the step's\n")
    aborted = tmp_path / "aborted"
    sealed = seal(base, OutBounds(files=20), aborted, ingest)
    assert sealed.exceeded and "limits.out_files" in sealed.exceeded
    assert not (base / "out").exists()
    assert not aborted.exists() or list(aborted.iterdir()) == []
    assert (tmp_path / "keep").read_text() == "not the step's\n"  # a link is not followed


@pytest.fixture
def deep_cleanup(tmp_path: Path) -> Iterator[None]:
    """What a failing run leaves is too deep for pytest's own clean-up (``shutil.rmtree``)."""
    yield
    subprocess.run(["rm", "-rf", str(tmp_path)], check=False)


@pytest.mark.usefixtures("deep_cleanup")
def test_a_folder_nested_past_any_recursion_is_removed(tmp_path: Path) -> None:
    """Deeper than ``shutil.rmtree`` recurses and than PATH_MAX: it was set aside, kept for good."""
    base = run_folder(tmp_path)
    os.close(nested(base / "out", 1100, 3))
    aborted = tmp_path / "aborted"
    sealed = seal(base, OutBounds(depth=8), aborted, ingest)
    assert sealed.exceeded and "limits.out_depth" in sealed.exceeded
    assert not aborted.exists() or list(aborted.iterdir()) == []
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.close(nested(scratch, 50, 3))
    discard(scratch, aborted)
    assert not scratch.exists() and (not aborted.exists() or list(aborted.iterdir()) == [])


def test_discard_removes_a_planted_link_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "precious").write_text("x")
    (tmp_path / "planted").symlink_to(target)
    discard(tmp_path / "planted", tmp_path / "aborted")
    assert (target / "precious").exists()
