"""`choir audit` over N attestations (target: 10,000 in <= 10 s here).

    python bench/audit_scale.py [--n 10000]

Each attestation references its own stored report and manifest, as real runs do; run folders
are left out (the pipeline's sealing is measured elsewhere), so this times the attestation
and object checks that dominate a large store.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    n = parser.parse_args().n
    home = Path(tempfile.mkdtemp())
    os.environ["CHOIR_HOME"] = str(home)
    os.environ["CHOIR_ARTIFACT_DIR"] = str(home / "artifacts")
    from choir._core.canonical import canonical_json
    from choir.ahdb import open_ahdb
    from choir.attest import AttestationStore, load_signer, mint
    from choir.audit import audit
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import (
        AttestationBody,
        Environment,
        Platform,
        Result,
        RunManifest,
        Target,
        VerificationReport,
    )

    store, atts, signer = ArtifactStore(), AttestationStore(), load_signer()
    minted: list[str] = []
    now = datetime.now(UTC)
    start = time.perf_counter()
    for i in range(n):
        target = Target(work_item="bench", tree_hash=f"{i:064x}")
        report = VerificationReport(
            verifier="unit",
            verifier_type="unit_tests",
            target=target,
            result=Result.PASS,
            summary=f"run {i}",
            next_actions=("none",),
            confidence=0.9,
        )
        manifest = RunManifest(
            run_id=f"r{i}",
            verifier="unit",
            status="PASS",
            timestamp_start=now,
            timestamp_end=now,
            tree_hash=target.tree_hash,
            platform=Platform(os="linux", arch="x86_64", sandbox="bwrap", isolation="namespace"),
        )
        body = AttestationBody(
            run_id=f"r{i}",
            verifier="unit",
            verifier_kind="unit_tests",
            verifier_version="bench",
            verifier_config_hash="0" * 64,
            commands=("true",),
            target=target,
            result=Result.PASS,
            report_hash=store.ingest_bytes(canonical_json(report)),
            manifest_hash=store.ingest_bytes(canonical_json(manifest)),
            environment=Environment(sandbox="bwrap", isolation="namespace"),
            started_at=now,
            ended_at=now,
        )
        att = mint(body, signer)
        atts.put(att)
        minted.append(att.id)
    db = open_ahdb()
    with db.batch():  # every attestation's outcome is logged, as attest_run does
        for att_id in minted:
            db.record_outcome(att_id)
    made = time.perf_counter() - start
    start = time.perf_counter()
    result = audit()
    took = time.perf_counter() - start
    print(f"attestations: {n}  stored+minted in {made:.1f} s ({n / made:.0f}/s)")
    print(f"choir audit: {took:.2f} s  ok={result.ok}  counts={result.counts}")
    if not result.ok:
        print(result.violations[:3])


if __name__ == "__main__":
    main()
