"""The AHDB: an append-only, hash-chained event log in SQLite (WAL); atoms are its replay.

Every write goes through ``_append``, which replays the rules (``rules.apply``) inside the
same ``BEGIN IMMEDIATE`` transaction that appends the event, so two processes writing at once
serialise, lose nothing, and keep the chain linear. UPDATE and DELETE on the log are refused
by triggers; anything done behind the store's back is found by ``choir audit``.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from choir._canonical import blake3_hex, canonical_json
from choir._paths import choir_home
from choir.ahdb.rules import Lookup, apply, failed_on
from choir.exceptions import IntegrityError, PromotionError
from choir.models import Atom, AtomKind, AtomStatus, Attestation

GENESIS = "0" * 64
_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY, prev_hash TEXT NOT NULL, event_hash TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL, payload TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
  BEGIN SELECT RAISE(ABORT, 'the AHDB log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
  BEGIN SELECT RAISE(ABORT, 'the AHDB log is append-only'); END;
"""


@dataclass(frozen=True)
class Event:
    seq: int
    prev_hash: str
    event_hash: str
    kind: str
    payload: dict[str, Any]
    created_at: str


def event_hash(prev_hash: str, seq: int, kind: str, payload: dict[str, Any],
               created_at: str) -> str:
    """The chain link: blake3 over the previous hash and this event's canonical JSON."""
    body = canonical_json({"seq": seq, "kind": kind, "payload": payload,
                           "created_at": created_at})
    return blake3_hex(prev_hash.encode() + b"\n" + body)


def attestation_lookup(attestations: Any, artifacts: Any,
                       trusted_keys: Collection[str] | None) -> Lookup:
    """A rules lookup that loads and fully verifies an attestation, or refuses it."""
    from choir.attest import verify_attestation

    def lookup(att_id: str) -> Attestation:
        try:
            att: Attestation = attestations.get(att_id)
        except Exception as exc:
            raise PromotionError(f"attestation {att_id[:16]} unavailable: {exc}") from None
        problems = verify_attestation(att, artifacts=artifacts, trusted_keys=trusted_keys)
        if problems:
            raise PromotionError(f"attestation {att_id[:16]} is invalid: {problems[0].kind}")
        return att

    return lookup


class AHDB:
    """The control-state store. Only attestations can promote; see ``choir.ahdb.rules``."""

    def __init__(self, path: Path | None = None, *, attestations: Any, artifacts: Any,
                 trusted_keys: Collection[str] | None = None) -> None:
        self.path = path or choir_home() / "ahdb.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lookup = attestation_lookup(attestations, artifacts, trusted_keys)
        self._local = threading.local()
        with self._conn() as conn:
            conn.executescript(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=60000")
            self._local.conn = conn
        return conn

    # -- reading -------------------------------------------------------------------------
    def events(self) -> Iterator[Event]:
        rows = self._conn().execute(
            "SELECT seq, prev_hash, event_hash, kind, payload, created_at FROM events "
            "ORDER BY seq").fetchall()
        for seq, prev, ehash, kind, payload, created in rows:
            yield Event(seq, prev, ehash, kind, json.loads(payload), created)

    def _replay(self, events: Sequence[Event]) -> dict[str, Atom]:
        atoms: dict[str, Atom] = {}
        for ev in events:
            atom = apply(atoms, ev.kind, ev.payload, datetime.fromisoformat(ev.created_at),
                         self._lookup)
            atoms[atom.id] = atom
        return atoms

    def atoms(self, work_item: str | None = None, kind: AtomKind | None = None) -> list[Atom]:
        found = self._replay(list(self.events())).values()
        return [a for a in found if (work_item is None or a.work_item == work_item)
                and (kind is None or a.kind is kind)]

    def is_asserted(self, work_item: str, tree_hash: str | None = None,
                    commit_sha: str | None = None) -> Atom | None:
        """The live ASSERT for ``work_item`` (at that tree/commit), if every claim still holds."""
        atoms = self._replay(list(self.events()))
        for atom in reversed(list(atoms.values())):
            if atom.kind is not AtomKind.ASSERT or not atom.references or \
                    atom.work_item != work_item:
                continue
            if tree_hash and atom.tree_hash != tree_hash:
                continue
            if commit_sha and atom.commit_sha != commit_sha:
                continue
            if all(atoms[r].status is AtomStatus.PROMOTED for r in atom.references):
                return atom
        return None

    def failed_verifiers(self, work_item: str, tree_hash: str) -> set[str]:
        """Verifiers with an attested FAIL for ``work_item`` on exactly this tree, on record."""
        return failed_on(self._replay(list(self.events())), work_item, tree_hash, self._lookup)

    # -- writing -------------------------------------------------------------------------
    def _append(self, kind: str, payload: dict[str, Any]) -> Atom:
        """The one write path: check the rules against the current log, then append.

        A write that the log already holds (an atom with the same keyed id, a promotion with
        the same evidence) returns the existing atom and appends nothing: that is what a
        resumed run replaying its last node looks like.
        """
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            events = list(self.events())
            atoms = self._replay(events)
            done = _already_applied(atoms, kind, payload)
            if done is not None:
                conn.execute("ROLLBACK")
                return done
            now = datetime.now(UTC)
            atom = apply(atoms, kind, payload, now, self._lookup)
            prev = events[-1].event_hash if events else GENESIS
            seq = (events[-1].seq if events else 0) + 1
            created = now.isoformat()
            conn.execute(
                "INSERT INTO events (seq, prev_hash, event_hash, kind, payload, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (seq, prev, event_hash(prev, seq, kind, payload, created), kind,
                 canonical_json(payload).decode(), created))
            conn.execute("COMMIT")
            return atom
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _new(self, kind: AtomKind, status: AtomStatus, *, key: str | None = None,
             **fields: Any) -> dict[str, Any]:
        """A new atom; with ``key`` its id is derived from it, so writing it twice is a no-op."""
        now = datetime.now(UTC)
        atom_id = blake3_hex(f"{kind.value}/{status.value}\n{key}".encode())[:32] if key else \
            secrets.token_hex(16)
        atom = Atom(id=atom_id, kind=kind, status=status, created_at=now, updated_at=now,
                    **fields)
        return {"atom": atom.model_dump(mode="json")}

    def propose(self, *, claim: str, work_item: str | None, tree_hash: str,
                commit_sha: str | None = None, required_verifiers: Sequence[str],
                key: str | None = None) -> Atom:
        return self._append("propose", self._new(
            AtomKind.ASSERT, AtomStatus.PROPOSED, key=key, claim=claim, work_item=work_item,
            tree_hash=tree_hash, commit_sha=commit_sha,
            required_verifiers=tuple(sorted(set(required_verifiers)))))

    def promote(self, atom_id: str, attestation_ids: Sequence[str]) -> Atom:
        return self._append("promote", {"atom_id": atom_id,
                                        "attestations": sorted(set(attestation_ids))})

    def demote(self, atom_id: str, attestation_id: str, reason: str) -> Atom:
        return self._append("demote", {"atom_id": atom_id, "attestation": attestation_id,
                                       "reason": reason[:500]})

    def assert_work_item(self, work_item: str, tree_hash: str, *, references: Sequence[str],
                         claim: str, commit_sha: str | None = None,
                         key: str | None = None) -> Atom:
        atoms = self._replay(list(self.events()))
        evidence = sorted({a for r in references if r in atoms for a in atoms[r].attestations})
        return self._append("assert", self._new(
            AtomKind.ASSERT, AtomStatus.PROMOTED, key=key, claim=claim, work_item=work_item,
            tree_hash=tree_hash, commit_sha=commit_sha, references=tuple(references),
            attestations=tuple(evidence)))

    def hypothesize(self, work_item: str | None, tree_hash: str, *, claim: str,
                    discriminating_test: str, attestation_ids: Sequence[str],
                    key: str | None = None) -> Atom:
        return self._append("hypothesize", self._new(
            AtomKind.HYPOTHESIZE, AtomStatus.PROPOSED, key=key, claim=claim[:1000],
            work_item=work_item,
            tree_hash=tree_hash, discriminating_test=discriminating_test[:600],
            attestations=tuple(attestation_ids)))

    def hyperthesis(self, work_item: str | None, tree_hash: str, *, claim: str,
                    attestation_ids: Sequence[str], key: str | None = None) -> Atom:
        return self._append("hyperthesis", self._new(
            AtomKind.HYPERTHESIS, AtomStatus.PROPOSED, key=key, claim=claim[:1000],
            work_item=work_item,
            tree_hash=tree_hash, attestations=tuple(attestation_ids)))


def _already_applied(atoms: dict[str, Atom], kind: str, payload: dict[str, Any]) -> Atom | None:
    """The atom a replayed write would produce, when the log already has it; else None."""
    if kind in ("propose", "assert", "hypothesize", "hyperthesis"):
        existing = atoms.get(str(payload.get("atom", {}).get("id", "")))
        if existing is not None and existing.kind.value == payload["atom"]["kind"]:
            return existing
        return None
    atom = atoms.get(str(payload.get("atom_id", "")))
    if kind == "promote" and atom is not None and atom.status is AtomStatus.PROMOTED and \
            set(atom.attestations) == set(payload.get("attestations") or ()):
        return atom
    return None


def open_ahdb(home: Path | None = None) -> AHDB:
    """The AHDB under ``CHOIR_HOME`` with the default stores and this home's trusted key."""
    from choir.artifacts import ArtifactStore
    from choir.attest import AttestationStore, trusted_key_ids

    base = home or choir_home()
    return AHDB(base / "ahdb.sqlite", attestations=AttestationStore(base / "attestations"),
                artifacts=ArtifactStore(), trusted_keys=trusted_key_ids(base))


def check_chain(events: Sequence[Event]) -> list[tuple[int, str, str, str]]:
    """(seq, what, expected, found) for every broken link in ``events``."""
    broken: list[tuple[int, str, str, str]] = []
    prev, expected_seq = GENESIS, 1
    for ev in events:
        if ev.seq != expected_seq:
            broken.append((ev.seq, "ahdb_seq", str(expected_seq), str(ev.seq)))
        if ev.prev_hash != prev:
            broken.append((ev.seq, "ahdb_prev_hash", prev, ev.prev_hash))
        recomputed = event_hash(ev.prev_hash, ev.seq, ev.kind, ev.payload, ev.created_at)
        if recomputed != ev.event_hash:
            broken.append((ev.seq, "ahdb_event_hash", recomputed, ev.event_hash))
        prev, expected_seq = ev.event_hash, ev.seq + 1
    return broken


__all__ = ["AHDB", "Event", "IntegrityError", "check_chain", "event_hash", "open_ahdb"]
