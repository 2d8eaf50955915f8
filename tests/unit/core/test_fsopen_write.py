"""``fsopen.write_whole``: a file replaced whole, or a clear error and nothing left behind.

Review 16c: ``choir gate --vsa DIR``, ``choir ahdb head --out DIR``, ``choir audit
--export-head DIR`` and ``choir attest bundle --out DIR`` raised ``IsADirectoryError`` with a
traceback and left ``.DIR.PID.tmp`` beside the target.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from choir._core import fsopen
from choir._core.errors import UserError
from tests import forked


def test_a_file_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "out.json"
    fsopen.write_whole(target, b"one")
    fsopen.write_whole(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


@pytest.mark.parametrize("shape", ["folder", "under a file"])
def test_a_path_that_cannot_be_a_file_is_a_user_error_and_leaves_nothing(
        tmp_path: Path, shape: str) -> None:
    tmp_path = tmp_path / "work"
    tmp_path.mkdir()
    (tmp_path / "plain").write_text("x")
    target = tmp_path / "dir" if shape == "folder" else tmp_path / "plain" / "out.json"
    if shape == "folder":
        target.mkdir()
    with pytest.raises(UserError, match="cannot write"):
        fsopen.write_whole(target, b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["dir", "plain"] if shape == "folder" else ["plain"])


def test_the_cli_says_so_with_exit_2(tmp_path: Path, choir_home: Path) -> None:
    folder = tmp_path / "vsa.json"
    folder.mkdir()
    proc = forked.run([sys.executable, "-m", "choir", "gate", "nothing-verified", "--vsa",
                       str(folder)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cannot write" in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.glob(".*.tmp"))
