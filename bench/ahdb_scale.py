"""AHDB write and gate latency at 1,000 / 10,000 / 100,000 events, and audit at the largest.

    python bench/ahdb_scale.py [--sizes 1000,10000,100000] [--samples 200]

Targets (issue #11 item 8): a write and a gate each within 5 ms at 100,000 events and flat
from 1,000 to 100,000; ``choir audit`` of 100,000 events within 30 s.

How the log is built: every event goes through the real write path (``AHDB._write``: rules
checked against the materialised tables, every attestation fully verified, event appended,
tables updated); to build 100,000 events in about a minute, 1,000 work items share one
``BEGIN IMMEDIATE`` transaction (``AHDB.batch``) and one signed head. Each work item is a
PROPOSE, a PROMOTE over a PASS attestation and an ASSERT: three events. Attestations are
minted over stored reports and manifests (no sandbox runs: those are measured elsewhere);
64 trees, one attestation each, so audit verifies 64 attestations and replays every event.

Measured rows: ``write``: one ``propose`` in its own transaction (commit, fsync and signed
head included), median of ``--samples``; ``promote``: one promotion, which also verifies
its attestation (signature and stored objects); ``gate``: ``is_asserted`` on an open store;
``gate+open``: opening the store and asking, as ``choir gate`` does after start-up.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TREES = 64


def _attestations(n: int) -> list[Any]:
    from choir._core.canonical import canonical_json
    from choir.attest import AttestationStore, load_signer, mint
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

    store, atts, signer, now = ArtifactStore(), AttestationStore(), load_signer(), \
        datetime.now(UTC)
    made = []
    for i in range(n):
        target = Target(work_item=None, tree_hash=f"{i:064x}")
        report = VerificationReport(verifier="unit", verifier_type="unit_tests", target=target,
                                    result=Result.PASS, summary=f"run {i}",
                                    next_actions=("none",), confidence=0.9)
        manifest = RunManifest(run_id=f"r{i}", verifier="unit", status="PASS",
                               timestamp_start=now, timestamp_end=now,
                               tree_hash=target.tree_hash,
                               platform=Platform(os="linux", arch="x86_64", sandbox="bwrap",
                                                 isolation="namespace"))
        body = AttestationBody(
            run_id=f"r{i}", verifier="unit", verifier_kind="unit_tests",
            verifier_version="bench", verifier_config_hash="0" * 64, commands=("true",),
            target=target, result=Result.PASS,
            report_hash=store.ingest_bytes(canonical_json(report)),
            manifest_hash=store.ingest_bytes(canonical_json(manifest)),
            environment=Environment(sandbox="bwrap", isolation="namespace"),
            started_at=now, ended_at=now)
        att = mint(body, signer)
        atts.put(att)
        made.append(att)
    return made


def _work_item(db: Any, i: int, atts: list[Any]) -> None:
    att = atts[i % len(atts)]
    tree = att.body.target.tree_hash
    claim = db.propose(claim="unit passes", work_item=f"wi{i}", tree_hash=tree,
                       required_verifiers=["unit"])
    claim = db.promote(claim.id, [att.id])
    db.assert_work_item(f"wi{i}", tree, references=[claim.id], claim="done")


def _median_ms(fn: Any, samples: int) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    home = Path(tempfile.mkdtemp())
    os.environ["CHOIR_HOME"] = str(home)
    os.environ["CHOIR_ARTIFACT_DIR"] = str(home / "artifacts")
    from choir.ahdb import open_ahdb
    from choir.audit import audit

    atts = _attestations(TREES)
    db = open_ahdb()
    for att in atts:
        db.record_outcome(att.id)
    rng, items, built = random.Random(0), 0, 0.0
    print(f"{'events':>8} {'write ms':>9} {'promote ms':>10} {'gate ms':>8} "
          f"{'gate+open ms':>12}")
    for size in sizes:
        start = time.perf_counter()
        while db.head()[0] < size:
            with db.batch():
                for _ in range(min(1000, (size - db.head()[0]) // 3 + 1)):
                    _work_item(db, items, atts)
                    items += 1
        built += time.perf_counter() - start
        n = db.head()[0]

        def write() -> None:
            db.propose(claim="unit passes", work_item="probe", tree_hash=atts[0].body.
                       target.tree_hash, required_verifiers=["unit"])

        probes = [db.propose(claim="p", work_item="probe2", tree_hash=a.body.target.tree_hash,
                             required_verifiers=["unit"]) for a in atts]
        queue = [(p.id, atts[k].id) for k, p in enumerate(probes)]

        def promote(queue: list[tuple[str, str]] = queue) -> None:
            atom_id, att_id = queue.pop()
            db.promote(atom_id, [att_id])

        def gate(items: int = items) -> None:
            i = rng.randrange(items)
            if db.is_asserted(f"wi{i}", atts[i % len(atts)].body.target.tree_hash) is None:
                raise SystemExit(f"wi{i} should be ASSERTed")

        def gate_open(items: int = items) -> None:
            i = rng.randrange(items)
            if open_ahdb().is_asserted(f"wi{i}") is None:
                raise SystemExit(f"wi{i} should be ASSERTed")

        w = _median_ms(write, args.samples)
        p = _median_ms(promote, min(len(queue), args.samples))
        g = _median_ms(gate, args.samples * 5)
        go = _median_ms(gate_open, max(20, args.samples // 4))
        print(f"{n:>8} {w:>9.2f} {p:>10.2f} {g:>8.3f} {go:>12.2f}", flush=True)
    print(f"built {db.head()[0]} events through the write path in {built:.1f} s "
          f"({db.head()[0] / built:.0f} events/s, batches of 1,000 work items)")
    start = time.perf_counter()
    result = audit()
    took = time.perf_counter() - start
    print(f"choir audit: {took:.2f} s  ok={result.ok}  counts={result.counts}")
    if not result.ok:
        print(result.violations[:3])


if __name__ == "__main__":
    main()
