"""Materialised state: reads never replay, the tables agree with the log, old logs upgrade."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.ahdb.backend import SCHEMA_VERSION
from choir.ahdb.rules import Replay, apply
from choir.evidence.tree import tree_hash
from tests.evidence import attest, make_repo


def _asserted(repo: Path) -> str:
    db = open_ahdb()
    claim = db.propose(claim="unit passes", work_item="wi", tree_hash=tree_hash(repo),
                       required_verifiers=["unit"])
    claim = db.promote(claim.id, [attest(repo, "unit", "true").id])
    return db.assert_work_item("wi", tree_hash(repo), references=[claim.id], claim="done").id


def test_the_tables_are_what_a_replay_of_the_log_gives(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    _asserted(repo)
    attest(repo, "unit", "false")  # logged outcome; demotes the claim
    db = open_ahdb()
    replay = Replay()
    for ev in db.events():
        replay.record(apply(replay, ev.kind, ev.payload, datetime.fromisoformat(ev.created_at),
                            db._lookup))
    assert {a.id: a for a in db.atoms()} == replay.atoms
    assert db.failed_verifiers("wi", tree_hash(repo)) == {"unit"}
    assert db.is_asserted("wi") is None


def test_a_log_written_before_the_tables_is_materialised_once_on_open(
        tmp_path: Path, choir_home: Path, ahdb_backend: str) -> None:
    if ahdb_backend == "postgres":
        pytest.skip("SQLite only: no Postgres log predates its tables")
    repo = make_repo(tmp_path / "repo")
    assert_id = _asserted(repo)
    conn = sqlite3.connect(choir_home / "ahdb.sqlite")
    conn.executescript("DROP TABLE atoms; DROP TABLE fails; DROP TABLE outcomes; "
                       "PRAGMA user_version = 0;")
    conn.close()
    db = open_ahdb()
    asserted = db.is_asserted("wi", tree_hash(repo))
    assert asserted is not None and asserted.id == assert_id
    assert sqlite3.connect(choir_home / "ahdb.sqlite").execute(
        "PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    (choir_home / "ahdb.sqlite.heads").unlink()  # an old home had no signed heads either
    open_ahdb()
    conn = sqlite3.connect(choir_home / "ahdb.sqlite")
    conn.execute("PRAGMA user_version = 0")
    conn.commit()
    open_ahdb()  # the upgrade signs the head of the log it was given
    from choir.audit import audit

    result = audit()
    assert result.ok, result.violations



def test_an_upgrade_puts_a_choir_verify_fail_on_record(tmp_path: Path, choir_home: Path,
                                                       ahdb_backend: str) -> None:
    """Version 1 tables kept a FAIL only for a work item; derived again, a ``choir verify``
    FAIL (no work item) blocks the tree too, on SQLite and on Postgres."""
    repo = make_repo(tmp_path / "repo")
    attest(repo, "unit", "false", work_item=None)
    db = open_ahdb()
    conn = db._conn()
    conn.execute("DELETE FROM fails")  # what a version-1 store held
    if ahdb_backend == "postgres":
        conn.execute("DELETE FROM choir_meta")
    else:
        conn.execute("PRAGMA user_version = 1")
    assert open_ahdb().failed_verifiers("wi", tree_hash(repo)) == {"unit"}
