"""``choir audit``: re-derive every hash, signature, chain link and ASSERT's backing.

Fail closed, and never crash: anything missing, unreadable or unexpected is a named
violation (kind, object, expected, found). Each part of the store is checked in its own
section, each stored thing in its own guard, so one broken file is named and the rest are
still checked; an error no check foresaw becomes ``<section>_unreadable`` with what was
raised. The AHDB log is replayed through the same rules that guard writes
(``choir.ahdb.rules``), so a row forged directly in the database is caught even with a
recomputed hash chain: it cannot carry a valid attestation signed by a trusted key.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from pydantic import Field

from choir._core import fsopen
from choir._core.paths import choir_home
from choir.ahdb.anchor import PinnedHead, check_pin
from choir.ahdb.heads import check_heads, heads_path, latest_signed, read_heads
from choir.ahdb.store import AHDB, Event, attestation_lookup, check_chain
from choir.attest import AttestationStore, trust_root, trust_violations, verify_attestation
from choir.audit.citations import check_citations
from choir.audit.ledger import compare_tables, contradicted, replay_log
from choir.config.database import redact
from choir.config.store_url import database_url
from choir.evidence.artifacts import MANIFEST, ArtifactStore, hash_file
from choir.exceptions import UserError
from choir.models import Attestation, Result, RunManifest, Violation
from choir.models._base import Frozen
from choir.verification.session import (
    MAX_MANIFEST,
    check_session,
    is_session_folder,
    missing_sessions,
)


class AuditResult(Frozen):
    ok: bool
    violations: tuple[Violation, ...] = ()
    counts: dict[str, int] = Field(default_factory=dict)
    # run folders no attestation names: a run still going, or one killed before it was
    # sealed or attested. Not evidence (nothing promotes from them), so not violations
    dangling: tuple[str, ...] = ()


def _v(kind: str, obj: str, expected: str, found: str) -> Violation:
    return Violation(kind=kind, object=obj[:200], expected=expected[:300], found=found[:300])


def _raised(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class _Audit:
    """One audit's shared findings; each method is a section (see ``audit``)."""

    def __init__(self, base: Path, artifacts_root: Path | None, trusted: Collection[str],
                 revoked: Collection[str] = ()) -> None:
        self.base, self.artifacts_root, self.trusted = base, artifacts_root, trusted
        self.revoked = revoked
        self.found: list[Violation] = []
        self.counts: Counter[str] = Counter()
        self.manifests: set[str] = set()
        self.stored_fails: list[Attestation] = []
        self.valid: dict[str, Attestation] = {}
        self.named_runs: set[str] = set()  # the run of every readable attestation
        self.dangling: list[str] = []
        self.store: ArtifactStore | None = None
        self.atts: AttestationStore | None = None

    def guarded(self, kind: str, obj: str, check: Callable[[], object]) -> None:
        """Run ``check``; whatever it raises is a violation, never a crash."""
        try:
            check()
        except UserError:
            raise  # a usage or configuration mistake: exit 2 with its file and fix
        except Exception as exc:
            self.found.append(_v(kind, obj, "a readable, well-formed store", _raised(exc)))

    def open_stores(self) -> None:
        self.store = ArtifactStore(self.artifacts_root)
        self.atts = AttestationStore(self.base / "attestations")

    # 1. every stored object re-hashes to its name
    def objects(self) -> None:
        assert self.store is not None
        objects = list(self.store.iter_objects())
        with ThreadPoolExecutor(max_workers=4) as pool:
            for digest, ok in zip(objects, pool.map(self.store.verify, objects), strict=True):
                self.counts["objects"] += 1
                if not ok:
                    self.found.append(_v("artifact_hash", digest, digest,
                                         "altered or unreadable"))

    # 2. every attestation: id, signature, trusted key, referenced objects, stored report
    def attestations(self) -> None:
        assert self.atts is not None
        for att_id in self.atts.ids():
            self.counts["attestations"] += 1
            self.guarded("attestation_unreadable", att_id, partial(self._one, att_id))

    def _one(self, att_id: str) -> None:
        assert self.atts is not None and self.store is not None
        att = self.atts.get(att_id)
        self.manifests.add(att.body.manifest_hash)
        self.named_runs.add(att.body.run_id)
        problems = verify_attestation(att, artifacts=self.store, trusted_keys=self.trusted,
                                      revoked_keys=self.revoked)
        self.found.extend(problems)
        if not problems:
            self.valid[att_id] = att
            if att.body.result is Result.FAIL:
                self.stored_fails.append(att)
        if not any(p.kind.startswith(("object_", "report_")) for p in problems):
            self.found.extend(check_citations(att, self.store))

    # 3. every run folder: manifest parses, lists exactly its files, and is attested;
    #    every attestation minted here has its run folder
    def runs(self) -> None:
        assert self.store is not None and self.atts is not None
        present = set()
        for run_id in self.store.iter_runs():
            self.counts["runs"] += 1
            present.add(run_id)
            self.guarded("run_unreadable", run_id, partial(self._run, run_id))
        for att_id, att in sorted(self.valid.items()):
            if att.body.run_id not in present and self.atts.path_of(att_id).is_file():
                self.found.append(_v("run_missing", att.body.run_id,
                                     f"the run folder attestation {att_id[:16]} vouches for",
                                     "absent"))
        self.found.extend(_v(*missing) for missing in
                          missing_sessions(self.store, self.valid.values()))

    def _run(self, run_id: str) -> None:
        assert self.store is not None and self.atts is not None
        run_dir = self.store.run_dir(run_id)
        manifest_path = run_dir / MANIFEST
        if is_session_folder(manifest_path):  # a `choir verify` session: checked by its owner
            self.found.extend(_v(kind, run_id, want, got) for kind, want, got in
                              check_session(run_dir, self.atts, self.trusted))
            return
        if run_id not in self.named_runs:
            # Still going, or killed before its attestation (as git's fsck names a dangling
            # object): listed, not evidence. An attested run whose attestation was removed
            # is caught where it is named: its session record, the AHDB's outcomes.
            self.dangling.append(run_id)
            self.counts["dangling_runs"] += 1
            return
        try:  # never through a link, never a FIFO or a device, bounded (review 21, F2)
            data = fsopen.read_bytes(run_dir, MANIFEST, MAX_MANIFEST + 1)
            if len(data) > MAX_MANIFEST:
                raise ValueError(f"larger than {MAX_MANIFEST} bytes")
            manifest = RunManifest.model_validate_json(data)
        except (OSError, ValueError) as exc:
            why = ("missing" if isinstance(exc, FileNotFoundError) else
                   f"unreadable (a link, a FIFO, a device?): {exc}" if isinstance(exc, OSError)
                   else f"invalid: {exc}")
            self.found.append(_v("run_manifest", run_id, "a readable manifest.json", why))
            return
        digest = hash_file(manifest_path)
        if digest not in self.manifests:
            self.found.append(_v("run_unattested", run_id, "manifest hash in an attestation",
                                 digest))
        files = {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")
                 if p.is_file() or p.is_symlink()} - {MANIFEST}
        for rel in sorted(files - set(manifest.files)):
            self.found.append(_v("run_extra_file", f"{run_id}/{rel}", "not present",
                                 "present"))
        for rel, want in sorted(manifest.files.items()):
            path = run_dir / rel
            got = hash_file(path) if path.is_file() else "missing"
            if got != want:
                self.found.append(_v("run_file_hash", f"{run_id}/{rel}", want, got))

    # 4. every recorded run's trace, exported and verified (choir.audit.traces)
    def traces(self) -> None:
        from choir.audit.traces import check_traces

        assert self.store is not None
        trace_counts: dict[str, int] = {}
        self.found.extend(check_traces(self.base, self.store, trace_counts,
                                       self.valid.values()))
        self.counts.update(trace_counts)

    # 5. the AHDB: chain links, a replay through the write rules, signed heads, anchors
    def ahdb(self, pin: PinnedHead | None) -> None:
        assert self.store is not None and self.atts is not None
        db_path, url = self.base / "ahdb.sqlite", database_url(self.base)
        where = redact(url) if url else str(db_path)
        if not (url or db_path.exists() or db_path.is_symlink()):
            # no log at all: every attestation's outcome and every signed head is missing
            self._heads(heads_path(db_path), {}, 0, (), ())
            self._anchor(pin, {}, 0)
            for att_id in sorted(self.valid):
                self.found.append(_v("ahdb_outcome_missing", att_id,
                                     "its outcome in the AHDB log", "no AHDB"))
            return
        try:
            db = AHDB(None if url else db_path, url=url, home=self.base,
                      attestations=self.atts, artifacts=self.store, trusted_keys=self.trusted)
            rows = list(db.rows())
        except UserError:
            raise
        except Exception as exc:  # fail closed on a store that does not open
            self.found.append(_v("ahdb_unreadable", where, "a readable log", _raised(exc)))
            self._anchor(pin, {}, 0)
            return
        self.guarded("ahdb_unreadable", where, lambda: self._damage(db, where))
        events = self._decode(rows)
        self.guarded("ahdb_unreadable", where, lambda: self._ledger(db, events))
        chain = {ev.seq: ev.event_hash for ev in events}
        tail = max(chain, default=0)
        self.guarded("ahdb_head_unreadable", str(db.backend.heads), lambda: self._heads(
            db.backend.heads, chain, tail, db.backend.shared_heads(), events))
        self._anchor(pin, chain, tail)

    def _damage(self, db: AHDB, where: str) -> None:
        if (damage := db.backend.damage()) is not None:
            self.found.append(_v("ahdb_unreadable", where, "a structurally sound database",
                                 damage))

    def _decode(self, rows: list[tuple[object, ...]]) -> list[Event]:
        events: list[Event] = []
        for row in rows:
            try:
                seq, prev, ehash, kind, payload, created = row
                events.append(Event(int(seq), str(prev), str(ehash), str(kind),  # type: ignore[call-overload]
                                    json.loads(str(payload)), str(created)))
            except (ValueError, TypeError) as exc:
                self.found.append(_v("ahdb_event_unreadable", f"event {row[0]}",
                                     "a well-formed event row", _raised(exc)))
        return events

    def _ledger(self, db: AHDB, events: list[Event]) -> None:
        assert self.store is not None and self.atts is not None
        for seq, what, expected, got in check_chain(events):
            self.found.append(_v(what, f"event {seq}", expected, got))
        lookup = attestation_lookup(self.atts, self.store, self.trusted)
        replay = replay_log(events, lookup, self.found, self.valid)
        self.counts["ahdb_events"] = len(events)
        self.counts["atoms"] = len(replay.atoms)
        self.found.extend(compare_tables(db, replay))
        self.found.extend(contradicted(replay, self.stored_fails))
        for att_id in sorted(set(self.valid) - replay.outcomes):
            self.found.append(_v("ahdb_outcome_missing", att_id, "its outcome in the AHDB log",
                                 "absent"))

    def _heads(self, path: Path, chain: dict[int, str], tail: int,
               shared: list[bytes] | tuple[()], events: Sequence[Event]) -> None:
        for kind, obj, expected, got in check_heads(path, chain, tail, self.trusted, shared,
                                                    self.revoked):
            self.found.append(_v(kind, obj, expected, got))
        # every event past the latest trusted signed head: written without the key, as no
        # honest Choir writes one (review 12, F1: a forged ASSERT there went unnamed)
        covered = latest_signed(read_heads(path, shared), chain, self.trusted)
        last = covered.seq if covered else 0
        for ev in events:
            if ev.seq > last:
                self.found.append(_v(
                    "ahdb_unsigned_tail", f"event {ev.seq}",
                    "covered by a head a trusted key signed",
                    f"a {ev.kind} event past the last head a trusted key signed (seq {last}): "
                    "written without the key, or under a key no longer trusted"))

    def _anchor(self, pin: PinnedHead | None, chain: dict[int, str], tail: int) -> None:
        if pin is not None:
            for kind, obj, expected, got in check_pin(pin, chain, tail, self.trusted):
                self.found.append(_v(kind, obj, expected, got))


def audit(*, home: Path | None = None, artifacts_root: Path | None = None,
          expect_head: PinnedHead | None = None) -> AuditResult:
    """Audit the store at ``home``; with ``expect_head``, also that its log contains that
    head (``choir.ahdb.anchor``: a rollback behind it is ``ahdb_rollback``).

    Raises:
        ConfigError: the pinned trusted-key list is malformed (exit 2: the user fixes it).
    """
    base = home or choir_home()
    root = trust_root(base)
    run = _Audit(base, artifacts_root, root.keys, root.revoked)
    run.found.extend(trust_violations(base))  # the pinned trust root itself
    try:
        run.open_stores()
    except UserError:
        raise
    except Exception as exc:
        run.found.append(_v("store_unreadable", str(base), "readable artifact and "
                            "attestation stores", _raised(exc)))
        return AuditResult(ok=False, violations=tuple(run.found), counts=dict(run.counts))
    run.guarded("artifact_store_unreadable", "objects", run.objects)
    run.guarded("attestation_store_unreadable", "attestations", run.attestations)
    run.guarded("run_store_unreadable", "runs", run.runs)
    run.guarded("trace_unreadable", "traces", run.traces)
    run.guarded("ahdb_unreadable", "ahdb", lambda: run.ahdb(expect_head))
    return AuditResult(ok=not run.found, violations=tuple(run.found), counts=dict(run.counts),
                       dangling=tuple(run.dangling))
