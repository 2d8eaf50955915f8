"""The interpreter's per-file cache is read once per process, and again when another process
saved it since: ``choir serve`` reads it ahead for its workers (``preload``), and a memo that
never looked at the file again would re-hash what it lacks on every request."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from choir.sandbox import _interpreter


def test_a_cache_saved_by_another_process_is_read_again(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(_interpreter, "_MEMO", {})
    monkeypatch.setattr(_interpreter, "_MEMO_STAT", {})
    path = _interpreter._cache_file("/some/venv")
    _interpreter._save(path, {"/a": [1, 2, 3, 4, 5, "a"]})
    assert _interpreter.preload() == 1
    assert _interpreter._load_cache(path) == {"/a": [1, 2, 3, 4, 5, "a"]}
    # another process (a worker of the service, a cold command) saves more
    other = path.with_name(".other")
    other.write_text(json.dumps({"/a": [1, 2, 3, 4, 5, "a"], "/b": [6, 7, 8, 9, 10, "b"]}))
    os.replace(other, path)
    assert set(_interpreter._load_cache(path)) == {"/a", "/b"}
    memo = _interpreter._load_cache(path)
    assert _interpreter._load_cache(path) is memo  # unchanged: the memo, not a re-read
