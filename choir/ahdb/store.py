"""The AHDB: an append-only, hash-chained event log with materialised state.

The rows live in SQLite (WAL; the embedded default) or Postgres (``CHOIR_DATABASE_URL``);
``choir.ahdb.backend`` is the seam, and every rule and statement here serves both. Every
write goes through ``_append``, which checks the rules (``rules.apply``) against the
materialised tables and, in the same exclusive write transaction, appends the event and
updates those tables, so two processes (or machines) writing at once serialise, lose
nothing, and keep the chain linear. Writes and listings never replay the log: measured on
2026-11-23, replaying cost 8 ms a write at 500 events and 100 ms at 4,000. The tables are
derived data, a cache: ``choir audit`` rebuilds them from the log and names any row that
differs, and what opens a gate or moves a branch is answered by a replay of the signed log
(``choir.ahdb.signed``), never by them. UPDATE and
DELETE on the log are refused by triggers; anything done behind the store's back is found
by ``choir audit``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from choir._core.canonical import blake3_hex, canonical_json
from choir._core.failpoints import failpoint
from choir._core.paths import choir_home
from choir.ahdb.backend import SCHEMA_VERSION, Backend, Conn, Session, SqliteBackend
from choir.ahdb.heads import (
    Head,
    append_head,
    head_key_id,
    head_line,
    latest_signed,
    parse,
    read_heads,
)
from choir.ahdb.rules import Change, Lookup, State, apply, live_assert, replay
from choir.attest import AttestationStore, load_signer, trusted_key_ids, verify_attestation
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError, PromotionError
from choir.models import Atom, AtomKind, AtomStatus, Attestation, Result, VerifierHistory

if TYPE_CHECKING:
    from choir.attest import SigningKey

GENESIS = "0" * 64


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


class _Tables:
    """``rules.State`` answered by the materialised tables, inside the writer's transaction."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def get(self, atom_id: str) -> Atom | None:
        row = self.conn.execute("SELECT body FROM atoms WHERE id = ?", (atom_id,)).fetchone()
        return Atom.model_validate_json(row[0]) if row else None

    def failed(self, tree_hash: str) -> set[str]:
        rows = self.conn.execute("SELECT verifier FROM fails WHERE tree_hash = ?",
                                 (tree_hash,)).fetchall()
        return {r[0] for r in rows}

    def has_outcome(self, attestation_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM outcomes WHERE attestation = ?",
                                 (attestation_id,)).fetchone() is not None

    def outcomes(self) -> set[str]:
        return {str(r[0]) for r in self.conn.execute("SELECT attestation FROM outcomes")}

    def declared(self, plan: str) -> frozenset[str] | None:
        return _declared(self.conn, plan)

    def record(self, change: Change, seq: int) -> None:
        if change.outcome:
            self.conn.execute("INSERT INTO outcomes (attestation, seq) VALUES (?, ?)",
                              (change.outcome, seq))
        if change.fails:
            self.conn.executemany(
                "INSERT INTO fails (work_item, tree_hash, verifier) VALUES (?, ?, ?) "
                "ON CONFLICT DO NOTHING", sorted(change.fails))
        atom = change.atom
        if atom is None:
            return
        self.conn.execute(
            "INSERT INTO atoms (id, created_seq, kind, status, work_item, tree_hash, body) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "status = excluded.status, body = excluded.body",
            (atom.id, seq, atom.kind.value, atom.status.value, atom.work_item, atom.tree_hash,
             atom.model_dump_json()))


def _declared(conn: Conn, plan: str) -> frozenset[str] | None:
    """The items of ``plan``'s ``plan`` event in the log (the rules allow one a plan; a log
    from before they refused a second holds their union)."""
    rows = conn.execute("SELECT payload FROM events WHERE kind = 'plan'")
    found = [frozenset(p.get("items") or ()) for (payload,) in rows
             if (p := json.loads(payload)).get("plan") == plan]
    return frozenset().union(*found) if found else None


def done_text(work_item: str) -> str:
    """The text of a ``choir run``'s ASSERT of ``work_item`` (``assert_done``)."""
    return f"{work_item} done"


def claim_text(name: str) -> str:
    """The text of a claim's ASSERT (``choir verify --claim NAME``): never a run's."""
    return f"{name} verified"


# The writes that promote (a claim, a work item's ASSERT, a plan's merge or release): before
# each, the FAILs stored but never logged are logged (``AHDB._log_unlogged_fails``).
_PROMOTING = frozenset({"promote", "assert", "integrate", "release"})


class AHDB:
    """The control-state store. Only attestations can promote; see ``choir.ahdb.rules``."""

    def __init__(self, path: Path | None = None, *, attestations: Any, artifacts: Any,
                 trusted_keys: Collection[str] | None = None,
                 signer: SigningKey | Callable[[], SigningKey] | None = None,
                 url: str | None = None, home: Path | None = None) -> None:
        """``path``: an SQLite file; ``url``: a Postgres database; neither: the configured
        store (``choir.config.store_url``: ``CHOIR_DATABASE_URL``, else ``store.url``, else
        ``$CHOIR_HOME/ahdb.sqlite``)."""
        self.backend: Backend = make_backend(path, url, home)
        # the SQLite file, or for Postgres the name its local heads file derives from
        self.path: Path = getattr(self.backend, "path", self.backend.heads.with_suffix(""))
        self.where = self.backend.where
        self.signer = signer
        self.trusted_keys = frozenset(trusted_keys or ())
        self._attestations = attestations
        self._check = attestation_lookup(attestations, artifacts, trusted_keys)
        self.backend.ensure_schema()
        if self.backend.version(self._conn()) < SCHEMA_VERSION:
            self._materialise_once()

    def _lookup(self, attestation_id: str) -> Attestation:
        """The attestation, loaded and fully verified (``attestation_lookup``); inside a
        write transaction, once: the rules and the outcome's own check read the same one two
        or three times, each a signature check and a re-hash of its report and manifest."""
        sess = self.backend.session()
        if not sess.depth:
            return self._check(attestation_id)
        # this store's trusted keys decided it; the store is kept with the answer, so its
        # id is never another store's while the transaction remembers it
        key = f"{id(self)}/{attestation_id}"
        if key not in sess.verified:
            sess.verified[key] = (self, self._check(attestation_id))
        return cast(Attestation, sess.verified[key][1])

    def claimed_result(self, attestation_id: str) -> Result | None:
        """The result attestation ``attestation_id``'s stored body claims, its signature and
        objects not checked; None when it cannot be loaded.

        Enough to tell a refused PASS outcome from a refused FAIL one (``signed.fail_closed``):
        the store refuses a body that does not hash to its id, and the log names the id."""
        try:
            return cast(Attestation, self._attestations.get(attestation_id)).body.result
        except Exception:  # missing, unreadable, another id: unknown, so not a PASS
            return None

    def unlogged_fails(self, logged: Collection[str]) -> Iterator[Attestation]:
        """The stored FAILs, valid here, whose ids ``logged`` (outcomes on record) lacks: a
        kill -9 or a full disk between storing an attestation and logging its outcome leaves
        one. The gate applies them to its replay (``signed``), a promoting write logs them
        (``_log_unlogged_fails``). Nothing when the store cannot list its ids."""
        ids = getattr(self._attestations, "ids", None)
        for att_id in ids() if ids is not None else ():
            if att_id in logged:
                continue
            try:
                att = self._lookup(att_id)
            except PromotionError:  # not valid here: it can neither promote nor demote
                continue
            if att.body.result is Result.FAIL:
                yield att

    @property
    def _local(self) -> Session:
        return self.backend.session()

    def _conn(self) -> Conn:
        return self.backend.session().conn

    def _materialise_once(self) -> None:
        """Tables from an older schema (or none): derive them once, from the log.

        The rules of today decide (``rules.replay``): an event they refuse changes nothing
        here, and ``choir audit`` names it. So a log written under laxer rules (an ASSERT
        that a logged FAIL on its tree now disputes) stops counting, rather than counting on.
        Except a refused FAIL-side event (``signed.fail_closed``; review 22b, F1): deriving
        the tables without it would put the claim it demoted back, so nothing is derived.

        Raises:
            IntegrityError: an event that puts a FAIL on record cannot be checked.
        """
        from choir.ahdb.signed import fail_closed

        with self._tx() as conn:
            if self.backend.version(conn) >= SCHEMA_VERSION:
                return
            for table in ("atoms", "fails", "outcomes"):  # executescript would commit
                conn.execute(f"DELETE FROM {table}")
            tables = _Tables(conn)
            refused: list[str] = []
            replay(self.events(), tables, self._lookup, fail_closed(self.claimed_result, refused))
            if refused:  # rolled back: the tables stay as they were, to derive again
                raise IntegrityError(f"the AHDB at {self.where} cannot derive its tables: "
                                     + "; ".join(refused[:3]))
            self.backend.set_version(conn, SCHEMA_VERSION)
            # no head is signed here: an upgrade never vouches for events it did not write

    @contextmanager
    def _tx(self) -> Iterator[Conn]:
        """One exclusive write transaction (``backend.begin``); nested use joins the outer."""
        sess = self.backend.session()
        conn = sess.conn
        if sess.depth:
            sess.depth += 1
            try:
                yield conn
            finally:
                sess.depth -= 1
            return
        self.backend.begin(conn)
        sess.depth, sess.appended = 1, None
        sess.verified.clear()  # checked again in every transaction: the store may change
        line = None
        try:
            yield conn
            if sess.appended and self.signer is not None:
                # signed and stored in the event's own transaction: no honest event is ever
                # committed without its head (a kill loses both or neither)
                line = head_line(*sess.appended, self._signing_key())
                self.backend.publish_head(line)
        except BaseException:
            sess.depth = 0
            sess.verified.clear()
            conn.execute("ROLLBACK")
            raise
        sess.depth = 0
        sess.verified.clear()
        conn.execute("COMMIT")
        failpoint("ahdb:committed")
        if line is not None:  # a copy outside the database; losing it loses no coverage
            append_head(self.backend.heads, line)

    def _signing_key(self) -> SigningKey:
        if callable(self.signer):  # loaded on the first write: reads never touch the key
            self.signer = self.signer()
        assert self.signer is not None
        return self.signer

    def signed_head(self, trusted_keys: Collection[str]) -> tuple[int, str]:
        """(seq, hash) of the latest head a trusted key signed that the log honours;
        (0, GENESIS) when there is none. Every event after it was written without the key.

        The head the last write stored is tried first (one signature), the others only when
        it does not answer: after an upgrade from heads kept in the file alone, or damage.
        """
        seq, head = self.head()
        if not seq:
            return 0, GENESIS
        last = self.backend.last_head()
        found = parse(last) if last is not None else None
        if isinstance(found, Head) and (found.seq, found.head) == (seq, head) and \
                head_key_id(found) in trusted_keys:
            return seq, head
        chain = {int(r[0]): str(r[1]) for r in
                 self._conn().execute("SELECT seq, event_hash FROM events")}
        best = latest_signed(read_heads(self.backend.heads, self.backend.shared_heads()),
                             chain, trusted_keys)
        return (best.seq, best.head) if best else (0, GENESIS)

    def adopt(self, through: int) -> None:
        """Sign a head over the log as it ends at ``through``: a person vouches for events no
        trusted signed head covers (``choir ahdb adopt``, after reading them).

        The one write that signs over events it did not make, and only on request: for a log
        from a Choir before heads were stored with their events, killed between a commit and
        its head. Never for events someone else wrote: restore those from a backup instead.

        Raises:
            IntegrityError: the log does not end at ``through`` (it moved, or the seq is
                wrong), or there is no key to sign with.
        """
        if self.signer is None:
            raise IntegrityError("no signing key: nothing can vouch for the events")
        with self._tx():
            seq, head = self.head()
            if seq != through or not seq:
                raise IntegrityError(f"the AHDB log ends at seq {seq}, not {through}: read "
                                     "the events again (`choir audit`) and name its end")
            self._local.appended = (seq, head)

    def _check_signed_tail(self, seq: int) -> None:
        """Refuse to extend a log whose last event (``seq``) no trusted signed head covers.

        Signing a head over it would vouch for events this writer cannot show were signed
        (review 12, F1: a forged ASSERT appended without the key was "laundered" by the next
        honest write). An honest Choir never leaves such an event, so one is an attack, or a
        writer without the key: ``choir audit`` names each (``ahdb_unsigned_tail``).

        Raises:
            IntegrityError: the tail is not covered.
        """
        if not seq:
            return
        trusted = self.trusted_keys | {self._signing_key().key_id}
        covered, _ = self.signed_head(trusted)
        if covered < seq:
            raise IntegrityError(
                f"the AHDB log at {self.where} ends at seq {seq}, but events {covered + 1}.."
                f"{seq} are not covered by a trusted signed head (written without the key); "
                "this writer signs no head over them. Run `choir audit`, and see "
                "docs/security.md (\"Events no trusted head covers\") for the recovery")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Many writes in one transaction: each still passes the rules, all commit together."""
        with self._tx():
            yield

    # -- reading (materialised tables; never a replay) -------------------------------------
    def rows(self, since: int = 0) -> Iterator[tuple[Any, ...]]:
        """The log's rows from seq ``since`` on, as stored (audit decodes each itself)."""
        yield from self._conn().execute(
            "SELECT seq, prev_hash, event_hash, kind, payload, created_at FROM events "
            "WHERE seq >= ? ORDER BY seq", (since,))

    def events(self, since: int = 0) -> Iterator[Event]:
        for seq, prev, ehash, kind, payload, created in self.rows(since):
            yield Event(seq, prev, ehash, kind, json.loads(payload), created)

    def identity(self) -> str:
        """Which store this is, for anchors kept elsewhere: the SQLite file's resolved path,
        or the Postgres URL without its password."""
        path = getattr(self.backend, "path", None)
        return str(Path(path).resolve()) if isinstance(path, Path) else self.where

    def first_hash(self) -> str | None:
        """The hash of the log's first event (which log this is, wherever it is kept), or
        None for an empty log."""
        row = self._conn().execute("SELECT event_hash FROM events WHERE seq = 1").fetchone()
        return str(row[0]) if row else None

    def head(self) -> tuple[int, str]:
        """(seq, event hash) of the last event; (0, GENESIS) for an empty log."""
        row = self._conn().execute(
            "SELECT seq, event_hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        return (int(row[0]), str(row[1])) if row else (0, GENESIS)

    def run_recorded(self, name: str) -> bool:
        """Whether ``choir run`` wrote atoms for work item ``name``: a HYPOTHESIZE or a
        HYPERTHESIS (only a run's rounds write them), or its ASSERT (``done_text``)."""
        return any(atom.kind is not AtomKind.ASSERT or atom.claim == done_text(name)
                   for atom in self.atoms(work_item=name))

    def claim_recorded(self, name: str) -> bool:
        """Whether ``choir verify --claim NAME`` ASSERTed a claim named ``name``
        (``claim_text``)."""
        return any(atom.kind is AtomKind.ASSERT and atom.claim == claim_text(name)
                   for atom in self.atoms(work_item=name))

    def atoms(self, work_item: str | None = None, kind: AtomKind | None = None) -> list[Atom]:
        sql, args = "SELECT body FROM atoms WHERE 1=1", list[str]()
        if work_item is not None:
            sql, args = sql + " AND work_item = ?", [*args, work_item]
        if kind is not None:
            sql, args = sql + " AND kind = ?", [*args, kind.value]
        rows = self._conn().execute(sql + " ORDER BY created_seq", args).fetchall()
        return [Atom.model_validate_json(r[0]) for r in rows]

    def is_asserted(self, work_item: str, tree_hash: str | None = None,
                    commit_sha: str | None = None) -> Atom | None:
        """The live ASSERT for ``work_item`` (at that tree/commit), if every claim still holds.

        Answered by the tables, a cache: what the gate and promotion decide on is answered
        by the signed log instead (``choir.ahdb.signed``)."""
        sql, args = "SELECT body FROM atoms WHERE work_item = ? AND kind = 'ASSERT' AND " \
                    "status = 'PROMOTED'", [work_item]
        if tree_hash:
            sql, args = sql + " AND tree_hash = ?", [*args, tree_hash]
        rows = self._conn().execute(sql + " ORDER BY created_seq DESC", args)
        return live_assert(_Tables(self._conn()),
                           (Atom.model_validate_json(body) for (body,) in rows), commit_sha)

    def asserted_by(self, work_item: str) -> set[str]:
        """The verifiers whose PASS promoted the claims behind ``work_item``'s ASSERTs (on
        any tree): what checked it, so what a tree holding its change must be checked by."""
        rows = self._conn().execute(
            "SELECT body FROM atoms WHERE work_item = ? AND kind = 'ASSERT' AND "
            "status = 'PROMOTED'", (work_item,))
        found: set[str] = set()
        for (body,) in rows:
            found |= self.verified_by(Atom.model_validate_json(body))
        return found

    def verified_by(self, asserted: Atom) -> set[str]:
        """The verifiers whose PASS promoted the claims behind the ASSERT ``asserted``: what
        an earlier round of its tree ran, so what reusing it stands for (review 19b: a plan's
        integration head reused an ASSERT of its tree that one item's required verifier
        never stood behind)."""
        tables = _Tables(self._conn())
        found: set[str] = set()
        for ref in asserted.references:
            claim = tables.get(ref)
            if claim is not None:
                found.update(claim.required_verifiers)
        return found

    def failed_verifiers(self, work_item: str | None, tree_hash: str) -> set[str]:
        """Verifiers with an attested FAIL on exactly this tree on record, for any work item
        or none (``choir verify``): the tree is the same whoever looked at it.
        ``work_item`` is accepted for the callers' sake and does not narrow the answer."""
        return _Tables(self._conn()).failed(tree_hash)

    # -- writing -------------------------------------------------------------------------
    def _log_unlogged_fails(self) -> None:
        """Log the outcome of every stored, valid FAIL whose outcome the log lacks.

        ``mint_attestation`` stores an attestation, then logs its outcome; a kill -9 or a
        full disk between the two leaves a FAIL the tables never saw (review 22b, F2: the
        gate looks in the store for these; the writer did not, and a later PASS on the tree
        promoted). Done before every write that promotes, so the rules then see the FAIL.
        The cost: the store's ids listed, the logged ones read in one query; the rest
        (normally none) checked. An unlogged PASS is left alone: it can only promote when
        a claim cites it, and ``choir audit`` names the missing outcome.
        """
        for att in list(self.unlogged_fails(_Tables(self._conn()).outcomes())):
            self.record_outcome(att.id)

    def _append(self, kind: str, payload: dict[str, Any]) -> Atom:
        atom = self._write(kind, payload)
        if atom is None:
            raise PromotionError(f"an AHDB {kind!r} event writes no atom")
        return atom

    def record_outcome(self, attestation_id: str) -> None:
        """Log a minted attestation's result (anchoring it), demoting what a FAIL contradicts.

        Called where attestations are minted, so the log and the attestation store can be
        held against each other: deleting or truncating events cannot hide an outcome.
        """
        with self._tx():
            if _Tables(self._conn()).has_outcome(attestation_id):
                return
            self._write("outcome", {"attestation": attestation_id})
            att = self._lookup(attestation_id)
            if att.body.result is Result.FAIL:  # every work item's claims on that tree
                self.demote_failed(None, att.body.target.tree_hash, [attestation_id])

    def _write(self, kind: str, payload: dict[str, Any],
               against: State | None = None) -> Atom | None:
        """The one write path: check the rules against the current state, then append.

        ``against``: a state derived from the signed log (``choir.ahdb.signed``) that the
        event must pass too, for writes with a global effect (a release).

        A write that the log already holds (an atom with the same keyed id, a promotion with
        the same evidence) returns the existing atom and appends nothing: that is what a
        resumed run replaying its last node looks like.
        """
        if kind in _PROMOTING:
            self._log_unlogged_fails()
        with self._tx() as conn:
            tables = _Tables(conn)
            done = _already_applied(tables, kind, payload)
            if done is not None:
                return done
            now = datetime.now(UTC)
            if against is not None:
                apply(against, kind, payload, now, self._lookup)
            change = apply(tables, kind, payload, now, self._lookup)
            prev_seq, prev = self.head()
            if self._local.appended is None and self.signer is not None:
                self._check_signed_tail(prev_seq)
            seq, created = prev_seq + 1, now.isoformat()
            ehash = event_hash(prev, seq, kind, payload, created)
            conn.execute(
                "INSERT INTO events (seq, prev_hash, event_hash, kind, payload, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (seq, prev, ehash, kind, canonical_json(payload).decode(), created))
            tables.record(change, seq)
            self._local.appended = (seq, ehash)
            return change.atom

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
        tables = _Tables(self._conn())
        claims = [c for c in (tables.get(r) for r in references) if c is not None]
        evidence = sorted({a for c in claims for a in c.attestations})
        return self._append("assert", self._new(
            AtomKind.ASSERT, AtomStatus.PROMOTED, key=key, claim=claim, work_item=work_item,
            tree_hash=tree_hash, commit_sha=commit_sha, references=tuple(references),
            attestations=tuple(evidence)))

    def hypothesize(self, work_item: str | None, tree_hash: str, *, claim: str,
                    discriminating_test: str, attestation_ids: Sequence[str],
                    key: str | None = None) -> Atom:
        """Record attested FAILs with a discriminating test; demotes what they contradict."""
        with self._tx():
            atom = self._append("hypothesize", self._new(
                AtomKind.HYPOTHESIZE, AtomStatus.PROPOSED, key=key, claim=claim[:1000],
                work_item=work_item,
                tree_hash=tree_hash, discriminating_test=discriminating_test[:600],
                attestations=tuple(attestation_ids)))
            if work_item:
                self.demote_failed(work_item, tree_hash, attestation_ids)
            return atom

    def demote_failed(self, work_item: str | None, tree_hash: str,
                      attestation_ids: Sequence[str]) -> list[Atom]:
        """Demote every PROMOTED claim of ``work_item`` on ``tree_hash`` that these FAILs hit.

        With no work item (``choir verify`` on a bare tree), claims of every work item on
        that tree are checked: a tree does not change, whoever looked at it.

        A tree does not change, so an attested FAIL of a required verifier on it means the
        evidence disagrees: the claim (and so the ASSERT over it) no longer holds. Each
        demotion is an ordinary checked ``demote`` event, in one transaction.
        """
        demoted: list[Atom] = []
        with self._tx() as conn:
            fails = [self._lookup(a) for a in sorted(set(attestation_ids))]
            rows = conn.execute(
                "SELECT body FROM atoms WHERE tree_hash = ? AND kind = 'ASSERT' AND "
                "status = 'PROMOTED' AND coalesce(CAST(? AS TEXT), work_item) = work_item "
                "ORDER BY created_seq", (tree_hash, work_item)).fetchall()
            for (body,) in rows:
                claim = Atom.model_validate_json(body)
                hit = next((f for f in fails if f.body.result is Result.FAIL and
                            f.body.verifier in claim.required_verifiers), None)
                if claim.references or hit is None:
                    continue
                demoted.append(self.demote(claim.id, hit.id, f"attested FAIL of "
                                           f"{hit.body.verifier} on this tree"))
        return demoted

    def verifier_history(self, verifier: str, limit: int = 500) -> VerifierHistory:
        """What this AHDB has seen of ``verifier`` (its latest ``limit`` claims): the trees it
        judged, and those where its evidence reversed (a demoted claim: PASS then FAIL on one
        tree; a refuted hypothesis: FAIL then PASS on one tree)."""
        conn = self._conn()
        trees = {t for (t,) in conn.execute(
            "SELECT DISTINCT tree_hash FROM fails WHERE verifier = ? LIMIT ?", (verifier, limit))}
        reversed_on: set[str] = set()
        rows = conn.execute(
            "SELECT body FROM atoms WHERE status IN ('PROMOTED', 'DEMOTED') AND kind IN "
            "('ASSERT', 'HYPOTHESIZE') ORDER BY created_seq DESC LIMIT ?", (limit,)).fetchall()
        for (body,) in rows:
            atom = Atom.model_validate_json(body)
            if atom.kind is AtomKind.ASSERT and not atom.references and \
                    verifier in atom.required_verifiers and atom.tree_hash:
                trees.add(atom.tree_hash)
                if atom.status is AtomStatus.DEMOTED:
                    reversed_on.add(atom.tree_hash)
            elif atom.kind is AtomKind.HYPOTHESIZE and atom.status is AtomStatus.DEMOTED and \
                    atom.tree_hash:
                try:
                    refuter = self._lookup(atom.attestations[-1]).body.verifier
                except PromotionError:
                    continue
                if refuter == verifier:
                    reversed_on.add(atom.tree_hash)
        return VerifierHistory(trees=len(trees | reversed_on), reversals=len(reversed_on))

    def attestation(self, attestation_id: str) -> Attestation:
        """The attestation, checked (valid and trusted) exactly as the rules check it."""
        return self._lookup(attestation_id)

    def resolve_hypothesis(self, atom_id: str, attestation_id: str) -> Atom:
        """Mark an open HYPOTHESIZE confirmed or refuted by a PASS (``rules.resolution``)."""
        from choir.ahdb.rules import resolution

        hypothesis = _Tables(self._conn()).get(atom_id)
        verdict = resolution(hypothesis, self._lookup(attestation_id)) if hypothesis else ""
        return self._append("resolve", {"atom_id": atom_id, "attestation": attestation_id,
                                        "verdict": verdict})

    def integrate(self, plan: str, item: str, *, assert_id: str, tree_hash: str, commit: str,
                  head: str, integration_assert: str, integration_tree: str) -> None:
        """Record an item's merge into a plan's integration branch (kept: its integration
        round passed): the item's ASSERT for the merged tree, the plan's for the new head."""
        self._write("integrate", {"plan": plan, "item": item, "assert": assert_id,
                                  "tree_hash": tree_hash, "commit": commit, "head": head,
                                  "integration_assert": integration_assert,
                                  "integration_tree": integration_tree})

    def merges(self, plan: str) -> list[dict[str, Any]]:
        """The payloads of ``plan``'s ``integrate`` events, in the log's order: what its
        driver merged, each naming the item's tree and the integration tree its round
        verified (the last names the plan's final tree). Read from the log itself, never
        the driver's record; ``read_signed`` says whether a trusted head covers them."""
        rows = self._conn().execute(
            "SELECT payload FROM events WHERE kind = 'integrate' ORDER BY seq")
        return [found for (payload,) in rows
                if (found := json.loads(payload)).get("plan") == plan]

    def declare_plan(self, plan: str, items: list[str]) -> None:
        """Record ``plan``'s items (ids) when it starts, once: its gate requires each merged,
        whatever the driver's record says later."""
        if not self._logged("plan", plan=plan):
            self._write("plan", {"plan": plan, "items": sorted(items)})

    def plan_items(self, plan: str) -> set[str] | None:
        """The items ``plan``'s ``plan`` event declared (None when there is none: a plan
        recorded by a Choir before they were written)."""
        found = _declared(self._conn(), plan)
        return None if found is None else set(found)

    def integrated(self, plan: str, item: str, head: str) -> bool:
        """Whether the log holds ``item``'s merge into ``plan`` at ``head`` already: a
        driver killed after writing the event, before recording it, never writes it twice."""
        return self._logged("integrate", plan=plan, item=item, head=head)

    def released(self, plan: str, *, commit: str, branch: str, previous: str | None) -> bool:
        """Whether the log holds ``plan``'s release of ``branch`` from ``previous`` to
        ``commit`` already: a promotion killed after its event, before the branch moved,
        never writes it twice when it runs again."""
        return self._logged("release", plan=plan, commit=commit, branch=branch[:255],
                            **{"from": previous or ""})

    def _logged(self, kind: str, **fields: str) -> bool:
        """Whether the log holds a ``kind`` event whose payload has exactly these values."""
        rows = self._conn().execute("SELECT payload FROM events WHERE kind = ?", (kind,))
        for (payload,) in rows:
            found = json.loads(payload)
            if all(found.get(key) == value for key, value in fields.items()):
                return True
        return False

    def release(self, plan: str, *, assert_id: str, tree_hash: str, commit: str, branch: str,
                previous: str | None, items: dict[str, str],
                against: State | None = None) -> None:
        """Record a plan's promotion: ``branch`` moved from ``previous`` to ``commit``, on
        the plan's ASSERT and its items' (work item id -> ASSERT id); checked like every
        write (and against ``against``, the signed log's state), and replayed by
        ``choir audit`` like every event."""
        self._write("release", {"plan": plan, "assert": assert_id, "tree_hash": tree_hash,
                                "commit": commit, "branch": branch[:255],
                                "from": previous or "", "items": dict(sorted(items.items()))},
                    against)

    def hyperthesis(self, work_item: str | None, tree_hash: str, *, claim: str,
                    attestation_ids: Sequence[str], key: str | None = None) -> Atom:
        return self._append("hyperthesis", self._new(
            AtomKind.HYPERTHESIS, AtomStatus.PROPOSED, key=key, claim=claim[:1000],
            work_item=work_item,
            tree_hash=tree_hash, attestations=tuple(attestation_ids)))


def _already_applied(atoms: _Tables, kind: str, payload: dict[str, Any]) -> Atom | None:
    """The atom a replayed write would produce, when the log already has it; else None."""
    if kind in ("propose", "assert", "hypothesize", "hyperthesis"):
        existing = atoms.get(str(payload.get("atom", {}).get("id", "")))
        if existing is not None and existing.kind.value == payload["atom"]["kind"]:
            return existing
        return None
    atom = atoms.get(str(payload.get("atom_id", "")))
    if kind == "resolve" and atom is not None and atom.status is not AtomStatus.PROPOSED and \
            payload.get("attestation") in atom.attestations:
        return atom
    if kind == "promote" and atom is not None and atom.status is AtomStatus.PROMOTED and \
            set(atom.attestations) == set(payload.get("attestations") or ()):
        return atom
    return None


def make_backend(path: Path | None, url: str | None, home: Path | None) -> Backend:
    """An SQLite file at ``path``, the Postgres database at ``url``, else the configured one."""
    base = home or choir_home()
    if path is None and url is None:
        from choir.config.store_url import database_url

        url = database_url(base)
    if url is not None:
        from choir.ahdb.postgres import PostgresBackend

        return PostgresBackend(url, base)
    return SqliteBackend(path or base / "ahdb.sqlite")


def open_ahdb(home: Path | None = None) -> AHDB:
    """The configured AHDB (``make_backend``) with the default stores and this home's key.

    The key signs a head record after every write (``choir.ahdb.heads``).
    """

    base = home or choir_home()
    return AHDB(attestations=AttestationStore(base / "attestations"), home=base,
                artifacts=ArtifactStore(), trusted_keys=trusted_key_ids(base),
                signer=lambda: load_signer(base))


def check_chain(events: Sequence[Event], after: tuple[int, str] = (0, GENESIS)
                ) -> list[tuple[int, str, str, str]]:
    """(seq, what, expected, found) for every broken link in ``events``, which follow the
    event ``after`` (seq, hash): by default the whole log from its start."""
    broken: list[tuple[int, str, str, str]] = []
    expected_seq, prev = after[0] + 1, after[1]
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
