"""Fixtures for tests that need a real PostgreSQL server (``choir.testing.postgres``).

One server per test session (per xdist worker), a fresh database per test. Without the
binaries the tests skip, naming the package to install; in CI (``CI`` set) they fail
instead, so a broken CI image cannot turn the Postgres suites into silent skips.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from choir.testing.postgres import PgServer, pg_bin, start_server


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    if pg_bin() is None:
        reason = "no initdb/postgres binary found (apt-get install postgresql)"
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI must install it")
        pytest.skip(reason)
    server = start_server(tmp_path_factory.mktemp("pg"))
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh, empty database on the session's server; this process's connections closed."""
    from choir.ahdb.postgres import close_connections

    url = pg_server.create_database()
    yield url
    close_connections(url)
