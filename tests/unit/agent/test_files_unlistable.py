"""A folder the file tools cannot open (mode 000) is named in their reply, never passed
over in silence (review 21: every walker fails closed or says what it left out). Root opens
a mode-000 folder anyway, so for root the refusal is simulated."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from choir.agent.files import RepoFiles
from tests.locked import lock


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "secret_test.py").write_text("TODO\n")
    (tmp_path / "seen.py").write_text("TODO\n")
    lock(tmp_path / "locked", monkeypatch)
    yield tmp_path
    monkeypatch.undo()
    (tmp_path / "locked").chmod(0o755)


def test_list_files_and_search_name_a_folder_they_cannot_open(repo: Path) -> None:
    """Old code: ``seen.py`` alone, as if the repo held nothing else."""
    files = RepoFiles(repo)
    assert "[locked: cannot be opened (Permission denied), not listed]" in files.list_files(".")
    assert "[locked: cannot be opened" in files.search("TODO")
