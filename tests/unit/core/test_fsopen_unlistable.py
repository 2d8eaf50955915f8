"""A folder the walk cannot open (mode 000) is never passed over in silence (review 21).

``choir._core.fsopen.walk`` skipped such a folder, so each of its callers read a tree with a
hole where the folder was, while ``$CHOIR_OUT``'s watchdog (a walker of its own) counted
the same folder as over. There is one walker now, failing closed; every caller of it either
refuses the tree or counts the folder. Root opens a mode-000 folder anyway, so for root the
refusal a user without root meets is simulated (``locked``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from choir._core import fsopen
from choir.sandbox.base import out_tally
from tests.locked import lock


@pytest.fixture
def locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tree ``root`` whose ``a/locked`` (holding a 9 MiB file and a test module) is mode
    000: a folder of that mode cannot be opened, for root as for anyone."""
    root = tmp_path / "root"
    folder = root / "a" / "locked"
    folder.mkdir(parents=True)
    (root / "a" / "seen.txt").write_text("x\n")
    (folder / "test_hidden.py").write_text("def test_x(): pass\n")
    with open(folder / "blob.pyc", "wb") as fh:
        fh.truncate(9 << 20)
    lock(folder, monkeypatch)
    yield root
    monkeypatch.undo()
    folder.chmod(0o755)


@pytest.mark.parametrize("ordered", [True, False])
def test_walk_refuses_a_folder_it_cannot_open(locked: Path, ordered: bool) -> None:
    """Old code: ``a/locked`` was listed, and nothing in it, without a word."""
    with pytest.raises(fsopen.Unlistable) as err:
        list(fsopen.walk(locked, ordered=ordered))
    assert err.value.filename == "a/locked" and "Permission denied" in str(err.value)


def test_walk_refuses_a_root_it_cannot_open(locked: Path) -> None:
    with pytest.raises(fsopen.Unlistable):
        list(fsopen.walk(locked / "a" / "locked"))
    with pytest.raises(FileNotFoundError):
        list(fsopen.walk(locked / "missing"))


def test_the_out_watchdog_counts_it_as_over(locked: Path) -> None:
    tally = out_tally(locked, cap_mb=10)
    assert tally.over and "cannot be listed (a/locked: Permission denied)" in tally.over


def test_collection_counts_it_as_over(locked: Path) -> None:
    """Old code: ``None`` (within bounds), the 9 MiB under the folder unseen."""
    from choir.evidence.collect import OutBounds, _over

    assert "cannot be listed" in (_over(locked, OutBounds(mb=5)) or "")


def test_a_snapshot_or_tree_scan_refuses_it(locked: Path) -> None:
    """Old code: a tree listed without ``a/locked/test_hidden.py``, hashed as whole."""
    from choir.evidence.scan import _every_entry, _files
    from choir.exceptions import UserError

    with pytest.raises(UserError, match="(?s)a/locked cannot be listed .*fix: make it readable"):
        _files(locked, None)
    with pytest.raises(OSError, match="Permission denied"):
        list(_every_entry(locked))


def test_the_spec_walk_and_the_bytecode_sweep_refuse_it(locked: Path) -> None:
    """Old code: the spec's walk left the locked test module out, and the sweep after an
    executor left its ``blob.pyc`` in place, both silently."""
    from choir.evidence.bytecode import remove_new_bytecode
    from choir.evidence.spec import _walk
    from choir.exceptions import UserError

    with pytest.raises(OSError, match="Permission denied"):
        dict(_walk(locked))
    with pytest.raises(UserError, match="(?s)a/locked cannot be listed .*fix: make it readable"):
        remove_new_bytecode(locked, 0)


def test_a_readable_tree_walks_as_before_in_either_order(tmp_path: Path) -> None:
    root = tmp_path / "t"
    for rel in ("b/x", "a/c/y", "a/z"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    ordered = [e.rel for e in fsopen.walk(root)]
    assert ordered == ["a", "a/c", "a/c/y", "a/z", "b", "b/x"]
    assert sorted(e.rel for e in fsopen.walk(root, ordered=False)) == ordered
