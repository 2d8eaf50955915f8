"""Where the AHDB's rows live: one small interface, an SQLite file or a Postgres database.

The store (``choir.ahdb.store``) holds every rule and every statement; a backend only opens
connections, creates the schema and starts the one kind of transaction the store needs: an
exclusive write, so two writers (threads, processes, machines) serialise and each sees the
other's committed rows before it checks the rules. SQLite gets that from ``BEGIN IMMEDIATE``,
Postgres from a transaction-scoped advisory lock taken first thing in the transaction (under
READ COMMITTED every later statement then reads what the previous writer committed). The SQL
is written once, in the dialect both accept (``?`` placeholders are rewritten for psycopg).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from choir.ahdb.heads import heads_path

# the shape of the materialised tables; a store whose tables are older derives them again
# from the log (2: attested FAILs on record per tree, from ``choir verify`` too)
SCHEMA_VERSION = 2


class Cursor(Protocol):
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Any: ...


class Conn(Protocol):
    """The part of a DB-API connection the store uses (``sqlite3.Connection`` has it)."""

    def execute(self, sql: str, args: Sequence[Any] = ..., /) -> Any: ...
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Any: ...


@dataclass
class Session:
    """One thread's connection, how deep it is inside the store's write transaction, and
    the attestations that transaction has verified (``AHDB._lookup``)."""

    conn: Conn
    depth: int = 0
    appended: tuple[int, str] | None = None
    verified: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """What the store needs from a database."""

    where: str  # for messages: a file path or a URL without its password
    heads: Path  # this machine's file of signed chain heads (``choir.ahdb.heads``)

    def session(self) -> Session: ...
    def begin(self, conn: Conn) -> None: ...
    def ensure_schema(self) -> None: ...
    def version(self, conn: Conn) -> int: ...
    def set_version(self, conn: Conn, version: int) -> None: ...
    def publish_head(self, record: bytes) -> None:
        """Store a signed head record in the ``heads`` table, in the open transaction."""
    def shared_heads(self) -> list[bytes]:
        """Every signed head record the database holds, oldest first."""
    def last_head(self) -> bytes | None:
        """The signed head record stored last, if any (the one the latest write made)."""
    def damage(self) -> str | None: ...


_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY, prev_hash TEXT NOT NULL, event_hash TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL, payload TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
  BEGIN SELECT RAISE(ABORT, 'the AHDB log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
  BEGIN SELECT RAISE(ABORT, 'the AHDB log is append-only'); END;
CREATE TABLE IF NOT EXISTS atoms (
  id TEXT PRIMARY KEY, created_seq INTEGER NOT NULL, kind TEXT NOT NULL,
  status TEXT NOT NULL, work_item TEXT, tree_hash TEXT, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS atoms_by_item ON atoms (work_item, kind, created_seq);
CREATE INDEX IF NOT EXISTS atoms_by_tree ON atoms (work_item, tree_hash, kind, status);
CREATE TABLE IF NOT EXISTS outcomes (attestation TEXT PRIMARY KEY, seq INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS atoms_on_tree ON atoms (tree_hash, kind, status);
CREATE TABLE IF NOT EXISTS fails (
  work_item TEXT NOT NULL, tree_hash TEXT NOT NULL, verifier TEXT NOT NULL,
  PRIMARY KEY (work_item, tree_hash, verifier));
CREATE INDEX IF NOT EXISTS fails_on_tree ON fails (tree_hash);
CREATE TABLE IF NOT EXISTS heads (n INTEGER PRIMARY KEY, record BLOB NOT NULL);
CREATE TRIGGER IF NOT EXISTS heads_no_update BEFORE UPDATE ON heads
  BEGIN SELECT RAISE(ABORT, 'the AHDB heads are append-only'); END;
CREATE TRIGGER IF NOT EXISTS heads_no_delete BEFORE DELETE ON heads
  BEGIN SELECT RAISE(ABORT, 'the AHDB heads are append-only'); END;
"""


@dataclass
class SqliteBackend:
    """The embedded default: one WAL-mode file under ``CHOIR_HOME``."""

    path: Path
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.where, self.heads = str(self.path), heads_path(self.path)

    def session(self) -> Session:
        sess: Session | None = getattr(self._local, "session", None)
        if sess is None:
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=60000")
            sess = self._local.session = Session(conn)
        return sess

    def begin(self, conn: Conn) -> None:
        conn.execute("BEGIN IMMEDIATE")

    def ensure_schema(self) -> None:
        conn = self.session().conn
        assert isinstance(conn, sqlite3.Connection)
        conn.executescript(_SQLITE_SCHEMA)

    def version(self, conn: Conn) -> int:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def set_version(self, conn: Conn, version: int) -> None:
        conn.execute(f"PRAGMA user_version = {int(version)}")

    def publish_head(self, record: bytes) -> None:
        self.session().conn.execute("INSERT INTO heads (record) VALUES (?)", (record,))

    def shared_heads(self) -> list[bytes]:
        return [bytes(r[0]) for r in
                self.session().conn.execute("SELECT record FROM heads ORDER BY n")]

    def last_head(self) -> bytes | None:
        row = self.session().conn.execute(
            "SELECT record FROM heads ORDER BY n DESC LIMIT 1").fetchone()
        return bytes(row[0]) if row else None

    def damage(self) -> str | None:
        """What SQLite's own structural check finds wrong with the file, or None.

        A file cut short or edited below the SQL layer can still answer the audit's queries
        (the pages they read survive) while the rest is gone; the check reads every page.
        """
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            rows = [str(row[0]) for row in conn.execute("PRAGMA quick_check").fetchall()]
        except sqlite3.DatabaseError as exc:
            return str(exc)
        finally:
            conn.close()
        return None if rows == ["ok"] else "; ".join(rows)[:500]
