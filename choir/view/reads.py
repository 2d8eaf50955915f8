"""What the viewer reads, through Choir's store APIs, without writing anything.

Opening some stores the ordinary way has side effects a viewer must not have: the trust
root pins this home's key on first use (creating the key), ``open_ahdb`` hands the AHDB a
signer, and a missing ``ahdb.sqlite`` would be created. The small functions here open the
same stores without those effects; an absent store reads as empty.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from choir._core import fsopen
from choir._core.canonical import blake3_hex, is_hash
from choir.ahdb import AHDB
from choir.attest import AttestationStore, verify_attestation
from choir.attest.keys import pinned_trust_root
from choir.config.store_url import database_url
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import ChoirError, IntegrityError, NotFoundError, UserError
from choir.models import Atom, Attestation, RunManifest, VerificationReport, Violation

MAX_DOCUMENT = 4 << 20

# which violation kinds say what about an attestation (choir.attest.check names them)
_SIGNATURE = {"attestation_schema", "attestation_id", "attestation_signature",
              "attestation_key_id"}
_UNTRUSTED = {"attestation_untrusted_key"}


@dataclass
class Stores:
    """The stores of one ``CHOIR_HOME`` and artifact directory, opened for reading."""

    home: Path
    artifacts: ArtifactStore
    attestations: AttestationStore = field(init=False)

    def __post_init__(self) -> None:
        self.attestations = AttestationStore(self.home / "attestations", reader=True)

    def trusted_keys(self) -> tuple[set[str] | None, str]:
        """The pinned key ids and where they came from; ``None`` when nothing is pinned yet
        (pinning is a write, left to the commands that sign)."""
        try:
            root = pinned_trust_root(self.home)
        except ChoirError as exc:
            return set(), f"unreadable: {str(exc)[:200]}"
        return (None, "no key pinned yet") if root is None else (set(root.keys), root.source)

    def ahdb(self) -> AHDB | None:
        """The shared (Postgres) AHDB, opened without a signer; None without one (SQLite is
        read on a read-only connection instead: ``atoms_and_demotions``)."""
        url = database_url(self.home)
        if url is None or not _pg_current(url):
            return None  # opening it would create or derive its tables: writes (review 17c)
        keys, _ = self.trusted_keys()
        return AHDB(attestations=self.attestations, artifacts=self.artifacts,
                    trusted_keys=keys or set(), signer=None, home=self.home)


@dataclass(frozen=True)
class AttestationView:
    """An attestation and its status, re-derived now (never cached)."""

    att_id: str
    att: Attestation | None
    error: str  # why it could not be loaded at all
    violations: tuple[Violation, ...]
    signature_ok: bool
    key_trusted: bool | None  # None: no key is pinned on this home
    objects_ok: bool
    trust_source: str

    @property
    def valid(self) -> bool:
        return self.att is not None and not self.violations and bool(self.key_trusted)


def attestation_view(stores: Stores, att_id: str) -> AttestationView:
    """Load ``att_id`` and re-check its id, signature, key trust and every object it names.

    Raises:
        NotFoundError: no attestation has this id.
        UserError: ``att_id`` is not an attestation id.
    """
    if not is_hash(att_id):
        raise UserError(f"not an attestation id: {att_id[:80]!r}")
    keys, source = stores.trusted_keys()
    try:
        att = stores.attestations.get(att_id)
    except NotFoundError:
        raise
    except IntegrityError as exc:
        return AttestationView(att_id, None, str(exc)[:500], (), False, None, False, source)
    found = tuple(verify_attestation(att, artifacts=stores.artifacts, trusted_keys=keys))
    kinds = {v.kind for v in found}
    return AttestationView(
        att_id, att, "", found, signature_ok=not kinds & _SIGNATURE,
        key_trusted=None if keys is None else not kinds & _UNTRUSTED,
        objects_ok=not kinds - _SIGNATURE - _UNTRUSTED, trust_source=source)


def load_report(stores: Stores, digest: str) -> tuple[VerificationReport | None, bool, str]:
    """(report, object re-hashes, error) for the stored report ``digest``."""
    try:
        data = stores.artifacts.read_bytes(digest, limit=MAX_DOCUMENT)
        return VerificationReport.model_validate_json(data), stores.artifacts.verify(digest), ""
    except (IntegrityError, ValidationError, ValueError) as exc:
        return None, False, str(exc)[:500]


def load_manifest(stores: Stores, digest: str) -> RunManifest | None:
    try:
        return RunManifest.model_validate_json(
            stores.artifacts.read_bytes(digest, limit=MAX_DOCUMENT))
    except (IntegrityError, ValidationError, ValueError):
        return None


def _sqlite_rows(path: Path, work_item: str) -> tuple[list[Atom], list[dict[str, Any]]]:
    """Atoms and demotions straight from the SQLite tables, on a read-only connection: the
    store's own connection would set up its schema and checkpoint the WAL, both writes."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        sql, args = "SELECT body FROM atoms", list[str]()
        if work_item:
            sql, args = sql + " WHERE work_item = ?", [work_item]
        atoms = [Atom.model_validate_json(r[0])
                 for r in conn.execute(sql + " ORDER BY created_seq", args)]
        demotions = [{"seq": seq, "created_at": created, **json.loads(payload)}
                     for seq, payload, created in conn.execute(
                         "SELECT seq, payload, created_at FROM events WHERE kind = 'demote' "
                         "ORDER BY seq")]
    finally:
        conn.close()
    return atoms, demotions


def _pg_current(url: str) -> bool:
    """Whether the Postgres database at ``url`` holds Choir's tables at the current schema,
    asked with reads only: opening an ``AHDB`` on one that has none creates them, and on one
    whose version is behind (a runner granted UPDATE on ``choir_meta`` can lower it) derives
    them again under the write lock: writes a GET of the viewer made (review 17c)."""
    from choir.ahdb.backend import SCHEMA_VERSION
    from choir.config.database import connection

    conn = connection(url)
    if conn.execute("SELECT to_regclass('choir_meta')").fetchone()[0] is None:
        return False
    row = conn.execute("SELECT value FROM choir_meta WHERE key = 'version'").fetchone()
    return row is not None and int(row[0]) == SCHEMA_VERSION


def tables_behind(stores: Stores) -> bool:
    """True when the home's SQLite AHDB predates the tables' current schema: opening its
    store (as the audit does) would derive them again, a write the viewer never makes."""
    from choir.ahdb.backend import SCHEMA_VERSION

    path = stores.home / "ahdb.sqlite"
    url = database_url(stores.home)
    if url is not None:
        return not _pg_current(url)
    if not path.is_file():
        return False
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0]) < SCHEMA_VERSION
    except sqlite3.DatabaseError:
        return False  # the audit names a damaged file
    finally:
        conn.close()


def atoms_and_demotions(stores: Stores, work_item: str = "") -> tuple[list[Atom],
                                                                      list[dict[str, Any]]]:
    """The AHDB's atoms (of ``work_item`` when given) and every demotion event, in order."""
    if database_url(stores.home) is None:
        path = stores.home / "ahdb.sqlite"
        return _sqlite_rows(path, work_item) if path.is_file() else ([], [])
    db = stores.ahdb()
    if db is None:
        return [], []
    atoms = db.atoms(work_item=work_item or None)
    demotions = [{"seq": ev.seq, "created_at": ev.created_at, **ev.payload}
                 for ev in db.events() if ev.kind == "demote"]
    return atoms, demotions


def attestation_rows(stores: Stores, att_ids: Any) -> list[dict[str, Any]]:
    """What a session lists about each of its attestations (loaded, not yet checked: the
    attestation's own page checks it)."""
    rows: list[dict[str, Any]] = []
    for att_id in att_ids if isinstance(att_ids, list) else []:
        try:
            body = stores.attestations.get(str(att_id)).body
        except (IntegrityError, NotFoundError) as exc:
            rows.append({"id": str(att_id), "error": str(exc)[:300]})
            continue
        manifest = load_manifest(stores, body.manifest_hash)
        rows.append({"id": str(att_id), "verifier": body.verifier,
                     "result": body.result.value, "run_id": body.run_id,
                     "report": body.report_hash, "sandbox": body.environment.sandbox,
                     "isolation": body.environment.isolation,
                     "limits": body.environment.limits_applied,
                     "log": manifest.files.get("logs/combined.log") if manifest else None})
    return rows


def verifier_run(stores: Stores, run_id: str) -> tuple[RunManifest, str] | None:
    """A verifier's sealed run folder: its manifest and the manifest's hash, or None.

    (``ArtifactStore.sealed`` also stores the manifest's bytes; a viewer only hashes them.)
    """
    try:  # never through a link, never from a FIFO (a planted one would hang the page)
        data = fsopen.read_bytes(stores.artifacts.run_dir(run_id), "manifest.json",
                                 MAX_DOCUMENT)
        return RunManifest.model_validate_json(data), blake3_hex(data)
    except (OSError, ValidationError, ValueError):
        return None


def plan_events(stores: Stores, plan_id: str) -> list[dict[str, Any]]:
    """The AHDB's ``integrate`` and ``release`` events of ``plan_id``, in order (read-only:
    SQLite on a read-only connection, Postgres through the store without a signer)."""
    kinds = ("integrate", "release")
    if database_url(stores.home) is None:
        path = stores.home / "ahdb.sqlite"
        if not path.is_file():
            return []
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            found = [(seq, kind, json.loads(payload), created) for seq, kind, payload, created
                     in conn.execute("SELECT seq, kind, payload, created_at FROM events WHERE "
                                     "kind IN (?, ?) ORDER BY seq", kinds)]
        finally:
            conn.close()
    else:
        db = stores.ahdb()
        found = [(ev.seq, ev.kind, ev.payload, ev.created_at)
                 for ev in (db.events() if db else []) if ev.kind in kinds]
    return [{"seq": seq, "kind": kind, "created_at": created, **payload}
            for seq, kind, payload, created in found
            if isinstance(payload, dict) and payload.get("plan") == plan_id]
