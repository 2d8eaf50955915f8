"""The ``trace`` verifier kind: a green thread that verifies its own run's trace so far.

A policy that lists a ``trace`` verifier (PARANOID does, by kind) cannot ASSERT until the
run's trace verifies: the check runs like any verifier, leaves its raw output in a sealed run
folder (the trace it checked, the verification result, a log), and hands back a bounded report
that is attested like every other. It runs in-process, not in a sandbox: it executes no code
from the repo, only Choir's own verifier over Choir's own records.

The trace is checked as it stands while this round's other verifiers still run, so the end of
the run and this round's planned steps are not yet required (``partial``); everything before
(earlier rounds, their citations and evidence) must verify in full.
"""

from __future__ import annotations

import platform
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from choir._core.canonical import canonical_json
from choir.models import (
    CommandRecord,
    Counts,
    FailureSignature,
    Platform,
    Result,
    RunManifest,
    Target,
    VerificationReport,
)
from choir.models.report import Citation

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import PlannedVerifier
    from choir.models.run import VerifierRun

COMMAND = "choir trace verify"
LOG = "logs/combined.log"


def parent_run(green_run_id: str, verifier: str) -> str:
    """The ``choir run`` a green thread belongs to (its id is ``RUN-rN-VERIFIER-REPLICA``)."""
    found = re.match(rf"^(.+)-r\d+-{re.escape(verifier)}-\d+$", green_run_id)
    return found.group(1) if found else green_run_id


def _log(result_lines: list[str]) -> bytes:
    return "".join(line.replace("\n", " ")[:400] + "\n" for line in result_lines).encode()


def run_trace_step(planned: PlannedVerifier, run_id: str, target: Target,
                   store: ArtifactStore) -> VerifierRun:
    """Verify the parent run's trace and store the evidence under ``run_id``'s folder."""
    from choir.models.run import VerifierRun
    from choir.trace.export import export_run
    from choir.trace.grounding import RecordSources
    from choir.trace.verify import verify_trace

    sealed = store.sealed(run_id)
    if sealed is None:  # a replay after a crash reuses the sealed evidence, never redoes it
        started = datetime.now(UTC)
        clock = time.monotonic()
        sources = RecordSources.of_home(store=store)
        trace = export_run(parent_run(run_id, planned.name), home=sources.home, store=store,
                           sealed_only=True)  # other threads of this round may be recording
        result = verify_trace(trace.model_dump(mode="json"), store, partial=True,
                              sources=sources)
        folder = store.run_dir(run_id)
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        (folder / "trace.json").write_bytes(canonical_json(trace))
        (folder / "verification.json").write_bytes(canonical_json(result))
        lines = [f"{'pass' if c.passed else 'FAIL'} {c.name}" for c in result.checks]
        lines += [f"failure {f.check}: {f.where}: {f.detail}" for f in result.failures]
        (folder / LOG).write_bytes(_log(lines))
        files = store.seal_run(run_id)
        manifest = RunManifest(
            run_id=run_id, verifier=planned.name, status="PASS" if result.ok else "FAIL",
            timestamp_start=started, timestamp_end=datetime.now(UTC),
            commit_sha=target.commit_sha, tree_hash=target.tree_hash,
            commands_executed=(CommandRecord(name="verify", command=COMMAND,
                                             exit_code=0 if result.ok else 1,
                                             duration_ms=int((time.monotonic() - clock) * 1000)),),
            platform=Platform(os=platform.system().lower(), arch=platform.machine(),
                              sandbox="in-process", isolation="none"),
            files=files)
        manifest_hash = store.write_manifest(run_id, manifest)
    else:
        manifest, manifest_hash = sealed
    report = _report(planned, target, manifest, store)
    return VerifierRun(verifier=planned.name, run_id=run_id, lens=planned.lens,
                       replica=planned.replica, diagnostic=planned.diagnostic,
                       tests=planned.tests, report=report,
                       report_hash=store.ingest_bytes(canonical_json(report)),
                       manifest_hash=manifest_hash)


def _report(planned: PlannedVerifier, target: Target, manifest: RunManifest,
            store: ArtifactStore) -> VerificationReport:
    """The bounded report, re-read from the sealed verification result (never from memory)."""
    from choir.report.signatures import signature_id
    from choir.trace.verify import TraceVerification

    result = TraceVerification.model_validate_json(
        store.read_bytes(manifest.files["verification.json"], limit=4 << 20))
    log = manifest.files[LOG]
    first = len(result.checks) + 1  # failure lines follow one line per check
    sigs = []
    for n, f in enumerate(result.failures[:8]):
        line = first + n
        sigs.append(FailureSignature(
            id=signature_id(f"trace_{f.check}", None, f.where, f.detail),
            kind=f"trace_{f.check}"[:64], location=f.where[:256], excerpt=f.detail[:200],
            citation=Citation(artifact=log, line_start=line, line_end=line,
                              span_hash=store.span_hash(log, line, line))))
    failed = sorted({f.check for f in result.failures})
    summary = ("every trace check passed" if result.ok else
               f"the run's trace does not verify: {', '.join(failed) or 'unverified'}")
    return VerificationReport(
        verifier=planned.name, verifier_type="trace", target=target,
        result=Result.PASS if result.ok else Result.FAIL, failure_signatures=tuple(sigs),
        signatures_truncated=max(0, len(result.failures) - 8), summary=summary[:600],
        next_actions=("Inspect `choir trace export RUN_ID`; the failures name each check.",),
        confidence=1.0, counts=Counts(run=len(result.checks),
                                      failed=sum(not c.passed for c in result.checks)),
        parser="trace", artifacts=dict(manifest.files))


__all__ = ["COMMAND", "parent_run", "run_trace_step"]
