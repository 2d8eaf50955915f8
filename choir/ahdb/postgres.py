"""The AHDB in PostgreSQL, for several runners on several machines (``CHOIR_DATABASE_URL``).

Same tables, same statements, same rules as SQLite (``choir.ahdb.backend``). Writers
serialise on one transaction-scoped advisory lock, so the hash chain stays linear and no
promotion is checked against a state another writer is about to change. The log is guarded
by triggers against UPDATE, DELETE and TRUNCATE; like on SQLite, someone who owns the database
can drop them, which is why the signed heads stay in a file on each writing machine and
``choir audit`` replays the log. psycopg is imported only when a URL is set.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from choir._core.canonical import blake3_hex
from choir.ahdb.backend import Session
from choir.config import database
from choir.config.database import redact

__all__ = ["PostgresBackend", "close_connections", "redact"]

# this process's sessions, one per (url, thread), each on that thread's shared connection
_sessions: dict[tuple[str, int, int], Session] = {}
_sessions_lock = threading.Lock()

# "the AHDB writer" (and the schema's): leases use their own keys (choir.graph.lease)
WRITE_LOCK = database.WRITE_LOCK

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS events (
      seq BIGINT PRIMARY KEY, prev_hash TEXT NOT NULL, event_hash TEXT NOT NULL UNIQUE,
      kind TEXT NOT NULL, payload TEXT NOT NULL, created_at TEXT NOT NULL)""",
    database.APPEND_ONLY_FUNCTION,
    """CREATE OR REPLACE TRIGGER events_no_change BEFORE UPDATE OR DELETE ON events
      FOR EACH ROW EXECUTE FUNCTION choir_append_only()""",
    """CREATE OR REPLACE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
      FOR EACH STATEMENT EXECUTE FUNCTION choir_append_only()""",
    """CREATE TABLE IF NOT EXISTS atoms (
      id TEXT PRIMARY KEY, created_seq BIGINT NOT NULL, kind TEXT NOT NULL,
      status TEXT NOT NULL, work_item TEXT, tree_hash TEXT, body TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS atoms_by_item ON atoms (work_item, kind, created_seq)",
    "CREATE INDEX IF NOT EXISTS atoms_by_tree ON atoms (work_item, tree_hash, kind, status)",
    "CREATE INDEX IF NOT EXISTS atoms_on_tree ON atoms (tree_hash, kind, status)",
    "CREATE TABLE IF NOT EXISTS outcomes (attestation TEXT PRIMARY KEY, seq BIGINT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS fails (
      work_item TEXT NOT NULL, tree_hash TEXT NOT NULL, verifier TEXT NOT NULL,
      PRIMARY KEY (work_item, tree_hash, verifier))""",
    # signed chain heads from every writing machine, each stored in its event's transaction
    # (each machine also keeps a copy in its own file)
    "CREATE TABLE IF NOT EXISTS heads (n BIGSERIAL PRIMARY KEY, record BYTEA NOT NULL)",
    """CREATE OR REPLACE TRIGGER heads_no_change BEFORE UPDATE OR DELETE ON heads
      FOR EACH ROW EXECUTE FUNCTION choir_append_only()""",
    # a TRUNCATE fires no row trigger: one emptied every machine's shared heads (review 17)
    """CREATE OR REPLACE TRIGGER heads_no_truncate BEFORE TRUNCATE ON heads
      FOR EACH STATEMENT EXECUTE FUNCTION choir_append_only()""",
    "CREATE INDEX IF NOT EXISTS fails_on_tree ON fails (tree_hash)",
    # the tables' schema version (backend.SCHEMA_VERSION); created last, so its presence
    # means the whole schema is in place (an older database runs every statement once)
    "CREATE TABLE IF NOT EXISTS choir_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)",
)


_ready: set[str] = set()  # URLs whose schema this process has seen in place


def close_connections(url: str | None = None) -> None:
    """Close this process's cached connections (all, or those to ``url``)."""
    for closed in database.close_connections(url):
        _ready.discard(closed)
    with _sessions_lock:
        for key in [k for k in _sessions if url is None or k[0] == url]:
            del _sessions[key]
    if url is None:
        _ready.clear()


class PostgresBackend:
    """The AHDB's tables in the database at ``url``."""

    def __init__(self, url: str, home: Path) -> None:
        self.url = url
        self.where = redact(url)
        parts = urlsplit(url)
        ident = f"{parts.hostname}:{parts.port}{parts.path}?{parts.query}"
        self.heads = home / f"ahdb-pg-{blake3_hex(ident.encode())[:16]}.heads"
        home.mkdir(parents=True, exist_ok=True)

    def session(self) -> Session:
        key = (self.url, os.getpid(), threading.get_ident())
        conn = database.connection(self.url)
        with _sessions_lock:
            sess = _sessions.get(key)
            if sess is None or sess.conn is not conn:
                sess = _sessions[key] = Session(conn)
        return sess

    def begin(self, conn: Any) -> None:
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(?)", (WRITE_LOCK,))

    def ensure_schema(self) -> None:
        if self.url in _ready:
            return
        database.ensure_tables(self.session().conn, "choir_meta", _SCHEMA)
        _ready.add(self.url)

    def version(self, conn: Any) -> int:
        row = conn.execute("SELECT value FROM choir_meta WHERE key = 'version'").fetchone()
        return int(row[0]) if row else 1  # 1: the tables as they were before versions

    def set_version(self, conn: Any, version: int) -> None:
        conn.execute("INSERT INTO choir_meta (key, value) VALUES ('version', ?) ON CONFLICT "
                     "(key) DO UPDATE SET value = excluded.value", (int(version),))

    def publish_head(self, record: bytes) -> None:
        self.session().conn.execute("INSERT INTO heads (record) VALUES (?)", (record,))

    def shared_heads(self) -> list[bytes]:
        rows = self.session().conn.execute("SELECT record FROM heads ORDER BY n")
        return [bytes(r[0]) for r in rows]

    def last_head(self) -> bytes | None:
        row = self.session().conn.execute(
            "SELECT record FROM heads ORDER BY n DESC LIMIT 1").fetchone()
        return bytes(row[0]) if row else None

    def damage(self) -> str | None:
        return None  # the server keeps its own pages whole; the audit checks every row
