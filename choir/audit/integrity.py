"""``choir audit``: re-derive every hash, signature, chain link and ASSERT's backing.

Fail closed: anything missing, unreadable or unexpected is a named violation (kind, object,
expected, found). The AHDB log is replayed through the same rules that guard writes, so a
row forged directly in SQLite is caught even with a recomputed hash chain: it cannot carry
a valid attestation signed by a trusted key.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import Field

from choir._core.paths import choir_home
from choir.ahdb.heads import check_heads, heads_path
from choir.ahdb.postgres import redact
from choir.ahdb.store import AHDB, attestation_lookup, check_chain
from choir.attest import AttestationStore, trust_violations, trusted_key_ids, verify_attestation
from choir.audit.citations import check_citations
from choir.audit.ledger import compare_tables, contradicted, replay_log
from choir.evidence.artifacts import MANIFEST, ArtifactStore, hash_file
from choir.exceptions import IntegrityError
from choir.models import Attestation, Result, RunManifest, Violation
from choir.models._base import Frozen
from choir.store_url import database_url
from choir.verification.session import check_session, is_session_folder


class AuditResult(Frozen):
    ok: bool
    violations: tuple[Violation, ...] = ()
    counts: dict[str, int] = Field(default_factory=dict)


def _v(kind: str, obj: str, expected: str, found: str) -> Violation:
    return Violation(kind=kind, object=obj, expected=expected, found=found)


def audit(*, home: Path | None = None, artifacts_root: Path | None = None) -> AuditResult:
    base = home or choir_home()
    store = ArtifactStore(artifacts_root)
    atts = AttestationStore(base / "attestations")
    trusted = trusted_key_ids(base)
    found: list[Violation] = list(trust_violations(base))  # the pinned trust root itself
    counts: Counter[str] = Counter()

    # 1. every stored object re-hashes to its name
    objects = list(store.iter_objects())
    with ThreadPoolExecutor(max_workers=4) as pool:
        for digest, ok in zip(objects, pool.map(store.verify, objects), strict=True):
            counts["objects"] += 1
            if not ok:
                found.append(_v("artifact_hash", digest, digest, "altered or unreadable"))

    # 2. every attestation: id, signature, trusted key, referenced objects, stored report
    manifests: set[str] = set()
    stored_fails: list[Attestation] = []
    valid: dict[str, Attestation] = {}
    for att_id in atts.ids():
        counts["attestations"] += 1
        try:
            att = atts.get(att_id)
        except IntegrityError as exc:
            found.append(_v("attestation_unreadable", att_id, "a valid attestation", str(exc)))
            continue
        manifests.add(att.body.manifest_hash)
        problems = verify_attestation(att, artifacts=store, trusted_keys=trusted)
        found.extend(problems)
        if not problems:
            valid[att_id] = att
        if not problems and att.body.result is Result.FAIL:
            stored_fails.append(att)
        if not any(p.kind.startswith(("object_", "report_")) for p in problems):
            found.extend(check_citations(att, store))

    # 3. every run folder: manifest parses, lists exactly its files, and is attested
    for run_id in store.iter_runs():
        counts["runs"] += 1
        run_dir = store.run_dir(run_id)
        manifest_path = run_dir / MANIFEST
        if is_session_folder(manifest_path):  # a `choir verify` session: checked by its owner
            found.extend(_v(kind, run_id, want, got)
                         for kind, want, got in check_session(run_dir, atts))
            continue
        try:
            manifest = RunManifest.model_validate_json(manifest_path.read_bytes())
        except (OSError, ValueError):
            found.append(_v("run_manifest", run_id, "a readable manifest.json", "missing/invalid"))
            continue
        digest = hash_file(manifest_path)
        if digest not in manifests:
            found.append(_v("run_unattested", run_id, "manifest hash in an attestation", digest))
        present = {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")
                   if p.is_file() or p.is_symlink()} - {MANIFEST}
        for rel in sorted(present - set(manifest.files)):
            found.append(_v("run_extra_file", f"{run_id}/{rel}", "not present", "present"))
        for rel, want in sorted(manifest.files.items()):
            path = run_dir / rel
            got = hash_file(path) if path.is_file() else "missing"
            if got != want:
                found.append(_v("run_file_hash", f"{run_id}/{rel}", want, got))

    # 4. every recorded run's trace, exported and verified (choir.audit.traces)
    from choir.audit.traces import check_traces

    trace_counts: dict[str, int] = {}
    found.extend(check_traces(base, store, trace_counts, valid.values()))
    counts.update(trace_counts)

    # 5. the AHDB: chain links, then a replay through the write rules
    db_path, url = base / "ahdb.sqlite", database_url(base)  # SQLite file or Postgres
    if url or db_path.exists():
        try:
            db = AHDB(None if url else db_path, url=url, home=base, attestations=atts,
                      artifacts=store, trusted_keys=trusted)
            events = list(db.events())
        except (json.JSONDecodeError, Exception) as exc:  # fail closed on a corrupt log
            found.append(_v("ahdb_unreadable", redact(url) if url else str(db_path),
                            "a readable log", str(exc)[:200]))
            return AuditResult(ok=False, violations=tuple(found), counts=dict(counts))
        for seq, what, expected, got in check_chain(events):
            found.append(_v(what, f"event {seq}", expected, got))
        replay = replay_log(events, attestation_lookup(atts, store, trusted), found, valid)
        counts["ahdb_events"] = len(events)
        counts["atoms"] = len(replay.atoms)
        found.extend(compare_tables(db, replay))
        found.extend(contradicted(replay, stored_fails))
        chain = {ev.seq: ev.event_hash for ev in events}
        for kind, obj, expected, got in check_heads(db.backend.heads, chain,
                                                    max(chain, default=0), trusted,
                                                    db.backend.shared_heads()):
            found.append(_v(kind, obj, expected, got))
        for att_id in sorted(set(valid) - replay.outcomes):
            found.append(_v("ahdb_outcome_missing", att_id, "its outcome in the AHDB log",
                            "absent"))
    else:  # no log at all: every attestation's outcome and every signed head is missing
        for kind, obj, expected, got in check_heads(heads_path(db_path), {}, 0, trusted):
            found.append(_v(kind, obj, expected, got))
        for att_id in sorted(valid):
            found.append(_v("ahdb_outcome_missing", att_id, "its outcome in the AHDB log",
                            "no AHDB"))
    return AuditResult(ok=not found, violations=tuple(found), counts=dict(counts))
