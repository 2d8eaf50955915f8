"""Where a run's LangGraph checkpoints live: SQLite under CHOIR_HOME, or Postgres.

With a Postgres store (``choir.config.store_url``) the checkpoints go to the same database as the
AHDB (``langgraph-checkpoint-postgres``), so a run killed on one machine resumes on another
from its last finished step. ``setup()`` creates or migrates the saver's tables; it runs under
an advisory lock because two runners starting at once on a new database would race on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

SETUP_LOCK = 0x43484F4952434B50  # "CHOIRCKP"
# a team plan's driver checkpoints under this prefix (``choir.team.driver``): a ``:`` no run id
# can hold, so a plan's thread is never listed, resumed or audited as a ``choir run``
PLAN_THREAD = "plan:"
_ready: set[str] = set()


def run_threads(threads: list[str]) -> list[str]:
    """The threads of ``choir run``s among a checkpoint store's threads."""
    return [t for t in threads if not t.startswith(PLAN_THREAD)]


@contextlib.asynccontextmanager
async def open_checkpointer(home: Path) -> AsyncIterator[Any]:
    """The configured async checkpoint saver, with Choir's checkpoint types allowed."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from choir.config.store_url import database_url
    from choir.graph.state import checkpoint_types

    serde = JsonPlusSerializer(allowed_msgpack_modules=checkpoint_types())
    url = database_url(home)
    if url is None:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(str(home / "checkpoints.sqlite")) as saver:
            saver.serde = serde
            # WAL (the saver's): a commit survives a killed process without an fsync of its
            # own; a power cut may lose the last steps, which a resume runs again
            await saver.conn.execute("PRAGMA synchronous=NORMAL")
            yield saver
        return
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    from choir.config.database import connect

    async with AsyncPostgresSaver.from_conn_string(url, serde=serde) as pg_saver:
        if url not in _ready:
            lock = connect(url)
            try:
                lock.execute("SELECT pg_advisory_lock(%s)", (SETUP_LOCK,))
                await pg_saver.setup()
            finally:
                lock.close()
            _ready.add(url)
        yield pg_saver


def pg_threads(url: str) -> list[str]:
    """Run ids with checkpoints in the Postgres store (``choir runs list``)."""
    from choir.config.database import connect

    conn = connect(url)
    try:
        if conn.execute("SELECT to_regclass('checkpoints')").fetchone()[0] is None:
            return []
        rows = conn.execute("SELECT DISTINCT thread_id FROM checkpoints "
                            "WHERE checkpoint_ns = ''").fetchall()
    finally:
        conn.close()
    return run_threads(sorted(str(r[0]) for r in rows))


def pg_latest(url: str, run_id: str) -> tuple[dict[str, Any], str] | None:
    """The last checkpoint's values and time of run ``run_id`` in the Postgres store."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from psycopg.rows import dict_row

    from choir.config.database import connect
    from choir.graph.state import checkpoint_types

    conn = connect(url)
    try:
        conn.row_factory = dict_row
        saver = PostgresSaver(conn, serde=JsonPlusSerializer(
            allowed_msgpack_modules=checkpoint_types()))
        found = saver.get_tuple({"configurable": {"thread_id": run_id, "checkpoint_ns": ""}})
    finally:
        conn.close()
    if found is None:
        return None
    return dict(found.checkpoint.get("channel_values") or {}), str(found.checkpoint.get("ts"))
