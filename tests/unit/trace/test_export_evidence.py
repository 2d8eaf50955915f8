"""A run's trace lists what grounds its claims, not every file its verifiers left.

A review (session 20): six verifier runs each leaving 9,000 files in $CHOIR_OUT (under the
default cap of 10,000) made a trace of 54,017 evidence files, over the format's 50,000:
`choir trace export` crashed (exit 4) and `choir audit` named the honest home's trace
unreadable forever. The manifest already hashes every file; the trace lists the manifest.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from choir._core.canonical import canonical_json
from choir.cli._errors import exit_code
from choir.evidence.artifacts import ArtifactStore
from choir.models import Platform, Result, RunManifest, Target, VerificationReport
from choir.trace import verify_trace
from choir.trace.export import build_run_trace
from choir.trace.model import MAX_EVIDENCE, EvidenceFile, Trace, TraceEvent

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _verifier_run(store: ArtifactStore, call: str, files: int) -> dict[str, str]:
    """A verifier run's stored report and manifest, its logs, and ``files`` other files."""
    listed = {"logs/combined.log": store.ingest_bytes(b"==> s\nran %s\n" % call.encode()),
              "logs/step-01-s.log": store.ingest_bytes(b"ran %s\n" % call.encode())}
    listed.update({f"out/f{n}": f"{call}-{n}".encode().hex().ljust(64, "0")[:64]
                   for n in range(files)})
    manifest = RunManifest(run_id=call, verifier="spam", status="PASS", timestamp_start=NOW,
                           timestamp_end=NOW, tree_hash="7" * 64, files=listed,
                           platform=Platform(os="linux", arch="x86_64", sandbox="local",
                                             isolation="none"))
    report = VerificationReport(verifier="spam", verifier_type="smoke",
                                target=Target(tree_hash="7" * 64), result=Result.PASS,
                                summary=f"{call}: every step exited 0", next_actions=("none",),
                                confidence=1.0)
    return {"result": "PASS", "report_hash": store.ingest_bytes(canonical_json(report)),
            "manifest_hash": store.ingest_bytes(manifest.model_dump_json().encode())}


def _events(store: ArtifactStore, calls: int, files: int) -> list[TraceEvent]:
    events = [TraceEvent(seq=1, kind="run_started", ts=NOW, data={"work_item": "w"})]
    for k in range(calls):
        call = f"run-r0-spam{k}-0"
        events += [TraceEvent(seq=len(events) + 1, kind="tool_call", ts=NOW, call_id=call,
                              name="spam"),
                   TraceEvent(seq=len(events) + 2, kind="tool_result", ts=NOW, call_id=call,
                              name="spam", data=_verifier_run(store, call, files))]
    return [*events, TraceEvent(seq=len(events) + 1, kind="run_ended", ts=NOW,
                                data={"status": "asserted"})]


def test_verifiers_leaving_many_files_export_a_trace_that_verifies(
        tmp_path: Path, store: ArtifactStore) -> None:
    events = _events(store, calls=6, files=9_000)
    trace = build_run_trace("run", events, (), home=tmp_path, store=store)
    names = {e.name: e.role for e in trace.evidence}
    assert names == {f"run-r0-spam{k}-0/{rel}": role for k in range(6)
                     for rel, role in (("report.json", "report"), ("manifest.json", "manifest"),
                                       ("logs/combined.log", "log"),
                                       ("logs/step-01-s.log", "log"))}
    result = verify_trace(trace.model_dump(mode="json"), store)
    assert result.ok, result.failures


def test_an_export_over_the_formats_bounds_is_a_clear_usage_error(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever outgrows the format still exits 2 naming the bound, not with a traceback."""
    from choir.cli._group import cli

    def too_big(run_id: str) -> Trace:
        evidence = [EvidenceFile(hash=f"{n:064x}", role="log") for n in range(MAX_EVIDENCE + 1)]
        return Trace.model_validate({"schema_version": 1, "run_id": run_id, "source": "run",
                                     "plan": {"schema_version": 1}, "events": [],
                                     "evidence": evidence, "outcome": {"status": "x"}})

    monkeypatch.setattr("choir.trace.export_run", too_big)
    out = tmp_path / "t.json"
    code = exit_code(lambda: cli.main(args=["trace", "export", "big", "-o", str(out)],
                                      prog_name="choir", standalone_mode=False))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "evidence" in err and "50000" in err and "big" in err
    assert "Traceback" not in err and not out.exists()
