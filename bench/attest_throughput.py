"""Attestations minted and verified per second, against bare ed25519 on the same bytes.

    python bench/attest_throughput.py [--n 2000]

Rows: bare ed25519 sign / verify of the canonical body bytes; ``mint``; ``verify_attestation``
without the store (id, key id, signature); and with the store (also re-hashing the report,
manifest, one log artifact and the manifest's files, and parsing report and manifest).
"""

from __future__ import annotations

import argparse
import base64
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from choir._core.canonical import canonical_json
from choir.attest import Signer, mint, verify_attestation
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


def rate(n: int, fn: Callable[[int], object]) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def build(store: ArtifactStore) -> AttestationBody:
    now = datetime.now(UTC)
    target = Target(work_item="bench", tree_hash="7" * 64, commit_sha="a" * 40)
    log_dir = store.run_dir("bench-run") / "logs"
    log_dir.mkdir(parents=True)
    (log_dir / "combined.log").write_bytes(b"test output line\n" * 4096)
    files = store.seal_run("bench-run")
    manifest = RunManifest(
        run_id="bench-run",
        verifier="unit",
        status="PASS",
        timestamp_start=now,
        timestamp_end=now,
        tree_hash=target.tree_hash,
        platform=Platform(os="linux", arch="x86_64", sandbox="local", isolation="none"),
        files=files,
    )
    report = VerificationReport(
        verifier="unit",
        verifier_type="unit_tests",
        target=target,
        result=Result.PASS,
        summary="all passed",
        next_actions=("none",),
        confidence=0.9,
    )
    return AttestationBody(
        run_id="bench-run",
        verifier="unit",
        verifier_kind="unit_tests",
        verifier_version="1",
        verifier_config_hash="c" * 64,
        commands=("pytest -q",),
        target=target,
        result=Result.PASS,
        report_hash=store.ingest_bytes(canonical_json(report)),
        manifest_hash=store.write_manifest("bench-run", manifest),
        artifacts={"logs/combined.log": files["logs/combined.log"]},
        environment=Environment(sandbox="local", isolation="none"),
        started_at=now,
        ended_at=now,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    n = parser.parse_args().n
    signer = Signer.generate()
    with tempfile.TemporaryDirectory() as tmp:
        store = ArtifactStore(Path(tmp))
        body = build(store)
        data = canonical_json(body)
        sig = base64.b64decode(signer.sign(data))
        public = signer.private_key.public_key()
        att = mint(body, signer)
        assert verify_attestation(att, artifacts=store) == []
        rows = {
            "bare ed25519 sign": rate(n, lambda _: signer.private_key.sign(data)),
            "bare ed25519 verify": rate(n, lambda _: public.verify(sig, data)),
            "mint": rate(n, lambda _: mint(body, signer)),
            "verify (no store)": rate(n, lambda _: verify_attestation(att)),
            "verify (with store)": rate(
                max(1, n // 4), lambda _: verify_attestation(att, artifacts=store)
            ),
        }
    bare = {"mint": rows["bare ed25519 sign"], "verify": rows["bare ed25519 verify"]}
    print(f"{'case':22} {'per second':>11} {'vs bare':>8}")
    for name, per_s in rows.items():
        base = bare["mint"] if "sign" in name or name == "mint" else bare["verify"]
        print(f"{name:22} {per_s:11.0f} {per_s / base:7.2f}x")


if __name__ == "__main__":
    main()
