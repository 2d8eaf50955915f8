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
from datetime import datetime
from pathlib import Path

from pydantic import Field

from choir._paths import choir_home
from choir.models import Atom, RunManifest, Violation
from choir.models._base import Frozen


class AuditResult(Frozen):
    ok: bool
    violations: tuple[Violation, ...] = ()
    counts: dict[str, int] = Field(default_factory=dict)


def _v(kind: str, obj: str, expected: str, found: str) -> Violation:
    return Violation(kind=kind, object=obj, expected=expected, found=found)


def audit(*, home: Path | None = None, artifacts_root: Path | None = None) -> AuditResult:
    from choir.ahdb.rules import apply
    from choir.ahdb.store import AHDB, attestation_lookup, check_chain
    from choir.artifacts import MANIFEST, ArtifactStore, hash_file
    from choir.attest import AttestationStore, trusted_key_ids, verify_attestation
    from choir.exceptions import IntegrityError, PromotionError
    from choir.verify import check_session, is_session_folder

    base = home or choir_home()
    store = ArtifactStore(artifacts_root)
    atts = AttestationStore(base / "attestations")
    trusted = trusted_key_ids(base)
    found: list[Violation] = []
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
    for att_id in atts.ids():
        counts["attestations"] += 1
        try:
            att = atts.get(att_id)
        except IntegrityError as exc:
            found.append(_v("attestation_unreadable", att_id, "a valid attestation", str(exc)))
            continue
        manifests.add(att.body.manifest_hash)
        found.extend(verify_attestation(att, artifacts=store, trusted_keys=trusted))

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

    # 4. the AHDB: chain links, then a replay through the write rules
    db_path = base / "ahdb.sqlite"
    if db_path.exists():
        db = AHDB(db_path, attestations=atts, artifacts=store, trusted_keys=trusted)
        try:
            events = list(db.events())
        except (json.JSONDecodeError, Exception) as exc:  # fail closed on a corrupt log
            found.append(_v("ahdb_unreadable", str(db_path), "a readable log", str(exc)[:200]))
            events = []
        for seq, what, expected, got in check_chain(events):
            found.append(_v(what, f"event {seq}", expected, got))
        lookup = attestation_lookup(atts, store, trusted)
        atoms: dict[str, Atom] = {}
        for ev in events:
            counts["ahdb_events"] += 1
            try:
                atom = apply(atoms, ev.kind, ev.payload, datetime.fromisoformat(ev.created_at),
                             lookup)
            except (PromotionError, ValueError, KeyError, TypeError) as exc:
                found.append(_v("ahdb_rule", f"event {ev.seq} ({ev.kind})",
                                "an event the promotion rules allow", str(exc)[:300]))
                continue
            atoms[atom.id] = atom
        counts["atoms"] = len(atoms)
    return AuditResult(ok=not found, violations=tuple(found), counts=dict(counts))
