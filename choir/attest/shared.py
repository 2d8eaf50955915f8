"""The attestation index in Postgres: every runner's attestations, readable from any machine.

With ``CHOIR_DATABASE_URL`` set, the AHDB is shared, so its log cites attestations minted on
other machines; the gate and ``choir audit`` must be able to load them. The files under
``$CHOIR_HOME/attestations`` stay the local copy; each one is also inserted here, write-once
(triggers refuse UPDATE and DELETE; a second insert of other bytes under an id is an
IntegrityError). Nothing read from here is trusted: ``AttestationStore.get`` re-derives the
id from the body, and ``verify_attestation`` checks the signature, as for a local file.
"""

from __future__ import annotations

from pathlib import Path

from choir.config import database
from choir.exceptions import IntegrityError

_ready: set[str] = set()  # URLs whose attestations table this process has seen in place


_SCHEMA = (
    database.APPEND_ONLY_FUNCTION,
    "CREATE TABLE IF NOT EXISTS attestations (id TEXT PRIMARY KEY, body BYTEA NOT NULL)",
    """CREATE OR REPLACE TRIGGER attestations_no_change BEFORE UPDATE OR DELETE
      ON attestations FOR EACH ROW EXECUTE FUNCTION choir_append_only()""",
)


class SharedIndex:
    """Attestation bytes keyed by id, in the configured Postgres database."""

    def __init__(self, url: str, home: Path, *, create: bool = True) -> None:
        """``create``: make the table now (a writer; the owner's first command makes the
        schema the runner role is then granted on); a reader (``choir view``) creates
        nothing in a database it only reads (review 17c), and a first write makes it."""
        self.url = url
        if create:
            self._ensure()

    def _ensure(self) -> None:
        if self.url not in _ready:
            database.ensure_tables(self.conn, "attestations", _SCHEMA)
            _ready.add(self.url)

    def _exists(self) -> bool:
        if self.url not in _ready and self.conn.execute(
                "SELECT to_regclass('attestations')").fetchone()[0] is None:
            return False
        _ready.add(self.url)  # made (a table is never dropped): asked once per process
        return True

    @property
    def conn(self) -> database.PgConn:
        return database.connection(self.url)

    def put(self, att_id: str, data: bytes) -> None:
        self._ensure()
        conn = self.conn
        conn.execute("INSERT INTO attestations (id, body) VALUES (?, ?) ON CONFLICT DO NOTHING",
                     (att_id, data))
        if self.get(att_id) != data:
            raise IntegrityError(f"attestation {att_id} is already indexed with other content")

    def get(self, att_id: str) -> bytes | None:
        if not self._exists():
            return None
        row = self.conn.execute(
            "SELECT body FROM attestations WHERE id = ?", (att_id,)).fetchone()
        return bytes(row[0]) if row else None

    def ids(self) -> list[str]:
        if not self._exists():
            return []
        rows = self.conn.execute("SELECT id FROM attestations ORDER BY id")
        return [str(r[0]) for r in rows]


def shared_index(home: Path, *, create: bool = True) -> SharedIndex | None:
    """The index when a Postgres store is configured, else None (files only)."""
    from choir.config.store_url import database_url

    url = database_url(home)
    return SharedIndex(url, home, create=create) if url else None
