"""The shared Postgres database: connections, the placeholder adapter and safe names for it.

The AHDB (``choir.ahdb.postgres``), the attestation index (``choir.attest.shared``), run
leases and LangGraph's checkpoints all live in the one database ``CHOIR_DATABASE_URL`` names
(``choir.config.store_url``). Each keeps its own tables; what they share is here, below all of
them, so that none imports another to reach the server. psycopg is imported only when a URL
is set.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from choir.exceptions import UserError

# One 64-bit key for the schema and the AHDB's writes: transaction-scoped, so every DDL and
# every append of the log is serialised (``CREATE ... IF NOT EXISTS`` races without it).
WRITE_LOCK = 0x43484F4952414844  # "CHOIRAHD"

# The trigger function behind every write-once table (the log, signed heads, attestations).
APPEND_ONLY_FUNCTION = """CREATE OR REPLACE FUNCTION choir_append_only() RETURNS trigger
  LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the AHDB log is append-only'; END $$"""


class PgConn:
    """A psycopg connection that takes the stores' ``?`` placeholders."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> Any:
        return self.raw.execute(sql.replace("?", "%s"), tuple(args) if args else None)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> None:
        rows = [tuple(r) for r in rows]
        if rows:
            with self.raw.cursor() as cur:
                cur.executemany(sql.replace("?", "%s"), rows)


def redact(url: str) -> str:
    """The URL without its password, for messages and file names."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def connect(url: str) -> Any:
    """A new autocommit psycopg connection; a clear UserError if the server does not answer."""
    try:
        import psycopg
    except ImportError:
        raise UserError("CHOIR_DATABASE_URL needs psycopg: pip install 'choir[postgres]'") \
            from None
    try:
        # keepalives: a holder whose machine vanished loses its locks in about a minute
        return psycopg.connect(url, autocommit=True, connect_timeout=10, keepalives=1,
                               keepalives_idle=30, keepalives_interval=10, keepalives_count=3)
    except psycopg.Error as exc:
        raise UserError(f"cannot reach the store at {redact(url)}: "
                        f"{str(exc).strip()[:300]}") from None


def ensure_tables(conn: Any, marker: str, statements: Sequence[str]) -> None:
    """Run ``statements`` once per database: unless table ``marker`` (created by the last of
    them) exists, all of them in one transaction under the write lock, where concurrent
    ``CREATE ... IF NOT EXISTS`` would otherwise race."""
    if conn.execute("SELECT to_regclass(?)", (marker,)).fetchone()[0] is not None:
        return
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(?)", (WRITE_LOCK,))
        for stmt in statements:
            conn.execute(stmt)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# this process's connections, one per (url, thread): stores are made per call, and a
# connection per object would exhaust the server's slots; the pid guards a fork
_connections: dict[tuple[str, int, int], PgConn] = {}
_lock = threading.Lock()


def connection(url: str) -> PgConn:
    """This thread's open connection to ``url``, made on first use (or after it closed)."""
    key = (url, os.getpid(), threading.get_ident())
    with _lock:
        conn = _connections.get(key)
    if conn is not None and not conn.raw.closed:
        return conn
    conn = PgConn(connect(url))
    with _lock:
        _connections[key] = conn
    return conn


def close_connections(url: str | None = None) -> list[str]:
    """Close this process's cached connections (all, or those to ``url``); the URLs closed."""
    closed: list[str] = []
    with _lock:
        for key in [k for k in _connections if url is None or k[0] == url]:
            conn = _connections.pop(key)
            closed.append(key[0])
            if key[1] == os.getpid():
                conn.raw.close()
    return closed
