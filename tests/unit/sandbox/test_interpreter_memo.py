"""The interpreter's per-file cache is read once per process, and again when another process
saved it since: ``choir serve`` reads it ahead for its workers (``preload``), and a memo that
never looked at the file again would re-hash what it lacks on every request."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from choir.sandbox import _interpreter
from tests.serving import idle_service


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


def test_an_idle_worker_reads_what_the_last_requests_saved(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The service preloads at its start; a worker is forked from it after a request saved
    the cache again (a changed venv, a new interpreter), so every later worker found the
    service's memo stale and parsed the file on its request's path (4.9 ms before the step,
    in a timeline of one request). The idle worker reads it before its request comes."""
    from choir.sandbox import _cgroups
    from choir.sandbox.bwrap import BwrapSandbox
    from choir.serve import worker

    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(_interpreter, "_MEMO", {})
    monkeypatch.setattr(_interpreter, "_MEMO_STAT", {})
    monkeypatch.setattr(BwrapSandbox, "available", classmethod(lambda cls: True))
    monkeypatch.setattr(_cgroups, "prearm", lambda *a, **k: None)
    path = _interpreter._cache_file("/some/venv")
    _interpreter._save(path, {"/a": [1, 2, 3, 4, 5, "a"]})
    _interpreter.preload()  # the service, at its start
    _interpreter._save(path, {"/b": [6, 7, 8, 9, 10, "b"]})  # a request, in a worker since gone
    worker.warm_idle(idle_service(tmp_path / "home"))  # the next worker, idle
    reads: list[Path] = []
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self) or
                        real(self, *a, **k))
    assert _interpreter._load_cache(path) == {"/b": [6, 7, 8, 9, 10, "b"]}
    assert reads == []  # the request's vouch parsed nothing
