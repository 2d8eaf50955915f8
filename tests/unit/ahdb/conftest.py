"""Every AHDB test runs twice: on the embedded SQLite file and on a real Postgres database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(params=["sqlite", "postgres"], autouse=True)
def ahdb_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[str]:
    """The backend under test; for Postgres, ``CHOIR_DATABASE_URL`` names a fresh database."""
    if request.param == "postgres":
        monkeypatch.setenv("CHOIR_DATABASE_URL", request.getfixturevalue("pg_url"))
    else:
        monkeypatch.delenv("CHOIR_DATABASE_URL", raising=False)
    yield str(request.param)
