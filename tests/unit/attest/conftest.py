from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from choir._core.canonical import canonical_json
from choir.attest import Signer, load_signer
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

TREE = "7" * 64
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Evidence:
    store: ArtifactStore
    signer: Signer
    body: AttestationBody
    log_hash: str


def make_report(result: Result = Result.PASS, tree: str = TREE) -> VerificationReport:
    return VerificationReport(
        verifier="unit",
        verifier_type="unit_tests",
        target=Target(work_item="fix-add", tree_hash=tree, commit_sha="a" * 40),
        result=result,
        summary="3 passed",
        next_actions=("none",),
        confidence=0.9,
    )


@pytest.fixture
def evidence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Evidence:
    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(tmp_path / "art"))
    store = ArtifactStore()
    log_dir = store.run_dir("run-1") / "logs"
    log_dir.mkdir(parents=True)
    (log_dir / "combined.log").write_bytes(b"collected 3 items\n3 passed\n")
    files = store.seal_run("run-1")
    manifest = RunManifest(
        run_id="run-1",
        verifier="unit",
        status="PASS",
        timestamp_start=NOW,
        timestamp_end=NOW,
        tree_hash=TREE,
        platform=Platform(os="linux", arch="x86_64", sandbox="local", isolation="none"),
        files=files,
    )
    manifest_hash = store.write_manifest("run-1", manifest)
    report_hash = store.ingest_bytes(canonical_json(make_report()))
    body = AttestationBody(
        run_id="run-1",
        verifier="unit",
        verifier_kind="unit_tests",
        verifier_version="1",
        verifier_config_hash="c" * 64,
        commands=("pytest -q",),
        target=make_report().target,
        result=Result.PASS,
        report_hash=report_hash,
        manifest_hash=manifest_hash,
        artifacts={"logs/combined.log": files["logs/combined.log"]},
        environment=Environment(sandbox="local", isolation="none"),
        started_at=NOW,
        ended_at=NOW,
    )
    return Evidence(store, load_signer(), body, files["logs/combined.log"])


@pytest.fixture
def report_factory() -> Callable[..., VerificationReport]:
    return make_report
