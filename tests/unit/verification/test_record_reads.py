"""Every reader of a stored record (a run folder's ``manifest.json``, a trace, a plan's
state) reads it as ``choir audit`` does: never through a link, never from a FIFO (a planted
one hung the viewer's run list, its run pages and ``choir mcp``'s ``list_runs`` for good),
size-capped. Whoever can write the store (an agent CLI on the host, an executor in trust
mode) can plant either."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.mcp.tools import _repo_of
from choir.verification.session import read_sealed_session, read_session
from choir.view.index import RunIndex

SESSION = {"kind": "verify_session", "run_id": "verify-20260101T000000-abcdef",
           "status": "PASS", "mood": "CALM", "repo": "/planted/repo",
           "timestamp_start": "2026-01-01T00:00:00+00:00",
           "timestamp_end": "2026-01-01T00:00:01+00:00", "tree_hash": "0" * 64}


def _within(seconds: float, call):  # type: ignore[no-untyped-def]
    """``call()``'s result, or a failure if it has not returned in ``seconds``."""
    out: list[object] = []
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "hung on a planted FIFO"
    return out[0]


def _planted(tmp_path: Path) -> tuple[Path, ArtifactStore]:
    store = ArtifactStore(tmp_path / "artifacts")
    fifo = store.run_dir("verify-20260101T000000-aaaaaa")
    fifo.mkdir(parents=True)
    os.mkfifo(fifo / "manifest.json")
    linked = store.run_dir("verify-20260101T000000-bbbbbb")
    linked.mkdir()
    (tmp_path / "elsewhere.json").write_text(json.dumps(SESSION))
    os.symlink(tmp_path / "elsewhere.json", linked / "manifest.json")
    real = store.run_dir(SESSION["run_id"])
    real.mkdir()
    (real / "manifest.json").write_text(json.dumps(SESSION))
    return tmp_path, store


def test_the_run_list_skips_a_fifo_or_linked_manifest_and_never_hangs(tmp_path: Path) -> None:
    home, store = _planted(tmp_path)
    rows = _within(10, lambda: RunIndex(home, store.root).rows())
    assert [r.run_id for r in rows] == [SESSION["run_id"]]  # type: ignore[attr-defined]


def test_mcp_repo_filter_reads_no_fifo_and_follows_no_link(tmp_path: Path) -> None:
    _, store = _planted(tmp_path)
    assert _within(10, lambda: _repo_of(store, "verify-20260101T000000-aaaaaa")) is None
    assert _repo_of(store, "verify-20260101T000000-bbbbbb") is None
    assert _repo_of(store, SESSION["run_id"]) == "/planted/repo"


def test_read_session_is_the_one_reader(tmp_path: Path) -> None:
    _, store = _planted(tmp_path)
    assert read_session(store.run_dir("verify-20260101T000000-aaaaaa")) is None
    assert read_session(store.run_dir("verify-20260101T000000-bbbbbb")) is None
    read = read_session(store.run_dir(SESSION["run_id"]))
    assert read is not None and read["status"] == "PASS"  # its seal unchecked
    assert read_sealed_session(store.run_dir("verify-20260101T000000-aaaaaa"), set()) is None
    assert read_sealed_session(store.run_dir(SESSION["run_id"]), set()) == (SESSION,
                                                                           "INVALID: absent")


def test_the_viewers_pages_and_a_plans_record_read_no_fifo(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for a verifier run's manifest (the run page), a session on its timeline, a
    trace swapped for a FIFO after the index's ``lstat``, and a plan's ``state.json``."""
    from choir.team.state import load_state
    from choir.view.index import _trace_row
    from choir.view.reads import Stores, verifier_run
    from choir.view.timeline import session

    home, store = _planted(tmp_path)
    monkeypatch.setenv("CHOIR_HOME", str(home))
    stores = Stores(home=home, artifacts=store)
    fifo = "verify-20260101T000000-aaaaaa"
    assert _within(10, lambda: verifier_run(stores, fifo)) is None
    assert _within(10, lambda: session(stores, fifo)) is None
    assert session(stores, "verify-20260101T000000-bbbbbb") is None  # the link
    assert session(stores, SESSION["run_id"]) == (  # no key pinned on this home
        SESSION, "UNCHECKED: no key is pinned on this home yet")
    os.mkfifo(tmp_path / "trace.jsonl")
    assert _within(10, lambda: _trace_row(tmp_path / "trace.jsonl", 100)) is None
    (home / "plans" / "p1").mkdir(parents=True)
    os.mkfifo(home / "plans" / "p1" / "state.json")
    assert _within(10, lambda: load_state("p1")) is None
