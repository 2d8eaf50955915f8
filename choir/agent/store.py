"""Durable agent contexts: one SQLite row per run, replaced atomically after each step.

A context is saved after the model's reply (so a crash never asks the model again) and
after the replies to its tool calls (which is where verification attempts are counted).
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from choir.agent.context import AgentContext


class ContextStore(Protocol):
    def load(self, run_id: str) -> AgentContext | None:
        """The last saved context of ``run_id``, or None."""
        ...

    def save(self, run_id: str, ctx: AgentContext) -> None:
        """Replace the saved context of ``run_id`` atomically."""
        ...


class SqliteContextStore:
    """A ContextStore in one SQLite file (WAL; safe across processes)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS agent_context (run_id TEXT PRIMARY KEY, "
                       "context TEXT NOT NULL, updated REAL NOT NULL)")
            # when each save happened and how many messages it held: the times a run's trace
            # gives its events (choir.trace.agent); the context itself has none
            db.execute("CREATE TABLE IF NOT EXISTS agent_saves (run_id TEXT NOT NULL, "
                       "messages INTEGER NOT NULL, ts TEXT NOT NULL)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def load(self, run_id: str) -> AgentContext | None:
        with self._lock, self._connect() as db:
            row = db.execute("SELECT context FROM agent_context WHERE run_id = ?",
                             (run_id,)).fetchone()
        return AgentContext.model_validate_json(row[0]) if row else None

    def save(self, run_id: str, ctx: AgentContext) -> None:
        with self._lock, self._connect() as db:
            db.execute("INSERT INTO agent_context (run_id, context, updated) "
                       "VALUES (?, ?, julianday('now')) ON CONFLICT(run_id) DO UPDATE SET "
                       "context = excluded.context, updated = excluded.updated",
                       (run_id, ctx.model_dump_json()))
            db.execute("INSERT INTO agent_saves (run_id, messages, ts) VALUES (?, ?, ?)",
                       (run_id, len(ctx.messages), datetime.now(UTC).isoformat()))

    def saves(self, run_id: str) -> list[tuple[int, str]]:
        """``(messages, ts)`` of every save of ``run_id``, oldest first."""
        with self._lock, self._connect() as db:
            rows = db.execute("SELECT messages, ts FROM agent_saves WHERE run_id = ? "
                              "ORDER BY rowid", (run_id,)).fetchall()
        return [(int(n), str(ts)) for n, ts in rows]
