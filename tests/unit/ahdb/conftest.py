"""Every AHDB test runs twice: on the embedded SQLite file and on a real Postgres database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from choir.attest import load_signer


@pytest.fixture(params=["sqlite", "postgres"], autouse=True)
def ahdb_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[str]:
    """The backend under test; for Postgres, ``CHOIR_DATABASE_URL`` names a fresh database."""
    if request.param == "postgres":
        monkeypatch.setenv("CHOIR_DATABASE_URL", request.getfixturevalue("pg_url"))
    else:
        monkeypatch.delenv("CHOIR_DATABASE_URL", raising=False)
    yield str(request.param)


@pytest.fixture
def pinned(choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    key = load_signer().key_id
    monkeypatch.setenv("CHOIR_TRUSTED_KEYS", key)
    return key
