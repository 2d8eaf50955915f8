"""A cut or damaged AHDB file is found even where the audit's queries would not reach it."""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.ahdb.backend import SqliteBackend
from choir.ahdb.heads import append_head, head_line, read_heads
from choir.trusted.keyfile import Signer


def test_a_heads_record_cut_just_before_its_line_end_is_torn(tmp_path: Path) -> None:
    path, signer = tmp_path / "ahdb.sqlite.heads", Signer.generate()
    append_head(path, head_line(1, "a" * 64, signer))
    append_head(path, head_line(2, "b" * 64, signer))
    assert all(not isinstance(h, str) for h in read_heads(path))
    path.write_bytes(path.read_bytes()[:-1])  # the last record parses, but was cut
    found = list(read_heads(path))
    assert not isinstance(found[0], str)
    assert found[1] == "line 2 is torn (no line end)"


def test_a_truncated_database_file_is_damage(tmp_path: Path, ahdb_backend: str) -> None:
    """(A real home's file cut this way still answered the audit's queries:
    tests/integration/test_audit_never_crashes.py.)"""
    if ahdb_backend != "sqlite":
        pytest.skip("SQLite only: a Postgres server keeps its own pages")
    backend = SqliteBackend(tmp_path / "ahdb.sqlite")
    backend.ensure_schema()
    conn = backend.session().conn
    conn.execute("CREATE TABLE filler (x TEXT)")
    conn.executemany("INSERT INTO filler VALUES (?)", [("x" * 500,)] * 200)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert SqliteBackend(backend.path).damage() is None
    data = backend.path.read_bytes()
    backend.path.write_bytes(data[: len(data) // 2 - 1])
    assert SqliteBackend(backend.path).damage()
