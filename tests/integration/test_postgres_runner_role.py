"""Postgres: a runner role that can append to the log and its heads, and roll back nothing.

The grants are those docs/security.md gives; the runner writes real events through Choir,
then tries every way to cut the log or its heads back, and each is refused by the server.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from choir.ahdb import open_ahdb
from choir.ahdb.postgres import close_connections
from choir.config.database import connect
from choir.evidence.tree import tree_hash
from tests.evidence import attest, make_repo

GRANTS = """
REVOKE ALL ON events, heads, attestations FROM {role};
GRANT SELECT, INSERT ON events, heads, attestations TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON atoms, fails, outcomes, choir_meta TO {role};
GRANT USAGE ON SEQUENCE heads_n_seq TO {role};
"""


def _as(url: str, user: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.split('@')[-1]}"))


def test_a_runner_role_appends_and_cannot_roll_back(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOIR_DATABASE_URL", pg_url)
    open_ahdb()  # the owner creates the schema
    role = f"choir_runner_{secrets.token_hex(4)}"
    owner = connect(pg_url)
    owner.execute(f"CREATE ROLE {role} LOGIN")
    for statement in GRANTS.format(role=role).strip().splitlines():
        owner.execute(statement)
    runner_url = _as(pg_url, role)
    close_connections()
    monkeypatch.setenv("CHOIR_DATABASE_URL", runner_url)

    repo = make_repo(tmp_path / "repo")
    db = open_ahdb()
    claim = db.propose(claim="unit passes", work_item="wi", tree_hash=tree_hash(repo),
                       required_verifiers=["unit"])
    claim = db.promote(claim.id, [attest(repo, "unit", "true").id])
    db.assert_work_item("wi", tree_hash(repo), references=[claim.id], claim="done")
    assert open_ahdb().head()[0] >= 4

    import psycopg

    runner = connect(runner_url)
    for attempt in ("DELETE FROM events WHERE seq > 1", "TRUNCATE events",
                    "UPDATE events SET payload = '{}'", "DELETE FROM heads",
                    "DROP TRIGGER events_no_change ON events", "DROP TABLE heads",
                    "ALTER TABLE events DISABLE TRIGGER ALL"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            runner.execute(attempt)
    runner.close()
    owner.close()
    close_connections()
    monkeypatch.setenv("CHOIR_DATABASE_URL", pg_url)
    from choir.audit import audit

    result = audit()
    assert result.ok, result.violations
