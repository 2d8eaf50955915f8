"""A cut log is said in the report whoever words it (review 23b).

The cut (``commands_executed[].output_cut``) reached the report only inside the deterministic
summary: a reporter model's summary replaced it, so a PASS over a cut log said nothing of the
cut; and ``fit`` shortened that summary before it dropped artifacts, so a report with many
long artifact names lost the cut's size, its step and the "not listed" note. The cut is now
evidence (``log_cut_bytes``) no reporter may change, and ``fit`` gives up artifacts first.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from choir._core.canonical import canonical_json
from choir._core.registry import REPORTERS
from choir.evidence.artifacts import ArtifactStore
from choir.models import (
    Limits,
    Result,
    StepSpec,
    Target,
    Usage,
    VerificationReport,
    VerifierKind,
    VerifierSpec,
)
from choir.models.report import REPORT_MAX_BYTES
from choir.report import abuild_report
from choir.report.bound import fit
from choir.report.reporter import _Reply, bounded, merge
from choir.sandbox import get_sandbox
from choir.verification.pipeline import PipelineResult, run_verifier

URL = "https://api.openai.com/v1/chat/completions"
JUNIT = ('<testsuite name="t" tests="1" failures="0" errors="0"><testcase classname="t" '
         'name="test_ok"/></testsuite>')
# 3 MB of output against out_mb: 1, then a complete JUnit result: a PASS with a cut log
SPEW = (f"{sys.executable} -c \"import sys; sys.stdout.write('choir ' * 500000)\"; "
        f"printf '%s' '{JUNIT}' > $CHOIR_OUT/junit.xml")
WORDED = json.dumps({"summary": "unit: every test passed.", "next_actions": ["none"],
                     "confidence": 0.9, "hyperthesis": [], "propose": "none"})
NOTE = "; 1 more artifact(s) not listed (the manifest lists every file)"


def _run(tmp_path: Path, *, reporter: str | None = None,
         reporter_name: str | None = None) -> tuple[VerificationReport, PipelineResult]:
    repo = tmp_path / "proj"
    repo.mkdir(exist_ok=True)
    (repo / "m.py").write_text("x = 1\n")
    spec = VerifierSpec(name="unit", kind=VerifierKind.UNIT_TESTS, parser="junit",
                        timeout_s=120, limits=Limits(out_mb=1),
                        steps=(StepSpec(name="spew", command=SPEW),))
    store, target = ArtifactStore(), Target(tree_hash="0" * 64)
    result = run_verifier(spec, repo=repo, sandbox=get_sandbox("local"), store=store,
                          run_id="cut", target=target)
    report = asyncio.run(abuild_report(result, spec=spec, store=store, target=target,
                                       reporter=reporter, reporter_name=reporter_name,
                                       deadline_s=30))
    return report, result


def _cut(result: PipelineResult) -> int:
    return sum(r.output_cut or 0 for r in result.manifest.commands_executed)


def test_the_model_reporters_wording_keeps_the_cut(tmp_path: Path) -> None:
    """``merge``, the model reporter's rules, without litellm (9 s to import): the fast
    twin of the end-to-end test below."""
    base, result = _run(tmp_path)
    reply = _Reply.model_validate_json(WORDED)
    report = bounded(base, merge(base, reply, Usage()), "model", "")
    assert report.reporter == "model" and report.summary == "unit: every test passed."
    assert report.log_cut_bytes == base.log_cut_bytes == _cut(result) > 1_000_000


@pytest.mark.slow  # litellm's import: 9 s of the test's 10
def test_a_model_worded_pass_over_a_cut_log_still_says_the_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as mock:
        route = mock.post(URL).mock(return_value=httpx.Response(200, json={
            "id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": WORDED}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}))
        report, result = _run(tmp_path, reporter="openai/gpt-4o-mini")
    assert route.called and report.reporter == "model", report.hyperthesis
    assert report.result is Result.PASS and report.summary == "unit: every test passed."
    assert _cut(result) > 1_000_000
    assert report.log_cut_bytes == _cut(result)  # the model's wording did not erase it
    assert '"log_cut_bytes":' in report.model_dump_json()


@pytest.fixture
def plugin() -> Iterator[Any]:
    names: list[str] = []

    def add(name: str, fn: Any) -> None:
        REPORTERS.register(name)(fn)
        names.append(name)

    yield add
    for name in names:
        REPORTERS.unregister(name)


def test_a_reporter_cannot_wipe_the_cut(tmp_path: Path, plugin: Any) -> None:
    async def hush(report: VerificationReport, **_: Any) -> VerificationReport:
        return report.model_copy(update={"summary": "all good", "log_cut_bytes": 0})

    plugin("hush", hush)
    report, result = _run(tmp_path, reporter_name="hush")
    assert report.reporter == "deterministic_fallback"
    assert any("log_cut_bytes" in h for h in report.hyperthesis), report.hyperthesis
    assert report.log_cut_bytes == _cut(result) > 0 and "log was cut" in report.summary


def _crowded(summary: str) -> dict[str, Any]:
    """A PASS over a cut log whose 15 listed artifacts have 400-character names: 7 KB."""
    artifacts = {f"out/{'d' * 400}{i:02d}/junit.xml": f"{i:064x}" for i in range(15)}
    return dict(verifier="u" * 64, verifier_type="unit_tests", target=Target(tree_hash="0" * 64),
                result=Result.PASS, summary=summary, next_actions=("No action needed.",),
                confidence=0.9, parser="junit", log_cut_bytes=19514240,
                artifacts={"manifest": "f" * 64, **artifacts})


def test_fit_drops_artifacts_before_it_cuts_the_summary_and_counts_them() -> None:
    said = ("u" * 64 + ": PASS: every step exited 0 and junit read a complete result, although "
            "the log was cut: 19514240 bytes of step " + "s" * 64 + " not kept (limits.out_mb)"
            " (1 run, 0 failed, 0 errors, 0 skipped)")
    report = fit(VerificationReport.model_construct(**_crowded(said + NOTE)))
    assert len(report.model_dump_json().encode()) <= REPORT_MAX_BYTES
    dropped = 15 + 1 - len(report.artifacts)
    assert dropped > 0 and "manifest" in report.artifacts
    assert report.summary == said + NOTE.replace("1 more", f"{1 + dropped} more")
    assert report.log_cut_bytes == 19514240


def test_fit_keeps_the_note_when_it_must_cut_the_summary() -> None:
    fields = _crowded("x " * 250 + NOTE)
    files = tuple(f"{'f' * 90}{i:02d}" for i in range(32))  # 3 KB no step may shorten
    fields["target"] = Target(tree_hash="0" * 64, files=files)
    report = fit(VerificationReport.model_construct(**fields))
    assert len(report.summary) < 500 + len(NOTE)  # it did have to cut
    assert report.summary.endswith(NOTE.replace("1 more", "16 more"))


def test_a_reporters_wording_gives_way_before_the_evidence_it_was_given() -> None:
    """The base fit with its evidence: a longer summary from a reporter is cut, not the
    artifacts (which would read as changed evidence and refuse the wording)."""
    base = fit(VerificationReport.model_construct(**_crowded("short" + NOTE)))
    worded = base.model_copy(update={"summary": "w " * 290, "reporter": "model"})
    report = bounded(base, worded, "model", "")
    assert report.reporter == "model" and report.artifacts == base.artifacts
    assert report.summary.startswith("w w")


def test_a_report_of_an_uncut_log_hashes_as_before() -> None:
    """Reports are stored and attested by hash: one without a cut keeps its old JSON."""
    old = {"schema_version": 1, "verifier": "v", "verifier_type": "unit_tests",
           "target": {"tree_hash": "0" * 64}, "result": "PASS", "summary": "ok",
           "next_actions": ["none"], "confidence": 0.9}
    report = VerificationReport.model_validate(old)
    assert report.log_cut_bytes == 0
    assert "log_cut_bytes" not in canonical_json(report).decode()
    assert "log_cut_bytes" not in report.model_dump_json()
    assert VerificationReport.model_validate_json(report.model_dump_json()) == report
