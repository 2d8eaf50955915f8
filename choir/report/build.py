"""From a finished run to a bounded VERIFICATION_REPORT.

RESULT comes from evidence only: exit codes, timeouts, OOM, sandbox errors and what the
parser read. The optional cheap model may word the summary and next actions, lower
confidence or mark the run INCONCLUSIVE; it can never raise a result (model.py clamps it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from choir.models import Counts, Result, Target, VerificationReport, VerifierSpec
from choir.models.report import NEXT_ACTION_MAX, SUMMARY_MAX
from choir.report.parsers import ParseInput, ParseResult, get_parser

if TYPE_CHECKING:
    from choir.artifacts import ArtifactStore
    from choir.pipeline import PipelineResult

_STRUCTURED = {"junit", "sarif"}


def decide(result: PipelineResult, parsed: ParseResult, parser: str) -> tuple[Result, str]:
    """The verdict and the reason, from evidence alone."""
    if result.infra_error:
        return Result.INCONCLUSIVE, f"the sandbox failed: {result.infra_error[:200]}"
    records = result.manifest.commands_executed
    for rec in records:
        if rec.timed_out:
            return Result.FAIL, f"step {rec.name} timed out after {rec.duration_ms} ms"
        if rec.oom_killed:
            return Result.FAIL, f"step {rec.name} was killed: out of memory"
        if rec.limit_exceeded:
            return Result.FAIL, f"step {rec.name} was stopped: {rec.limit_exceeded}"
        if rec.exit_code != 0:
            return Result.FAIL, f"step {rec.name} exited {rec.exit_code}"
    counts = parsed.counts
    if (counts.failed or 0) > 0 or (counts.errors or 0) > 0 or parsed.signatures:
        return Result.FAIL, "the parser found failures although every step exited 0"
    if parser in _STRUCTURED and parsed.error:
        return Result.INCONCLUSIVE, f"declared evidence unreadable: {parsed.error[:200]}"
    if not records:
        return Result.INCONCLUSIVE, "no step ran"
    return Result.PASS, "every step exited 0"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _counts_text(counts: Counts) -> str:
    parts = [f"{v} {k}" for k, v in counts.model_dump().items() if v is not None]
    return ", ".join(parts)


def deterministic_report(result: PipelineResult, *, spec: VerifierSpec, target: Target,
                         parsed: ParseResult, verdict: Result, reason: str) -> VerificationReport:
    counts = _counts_text(parsed.counts)
    summary = f"{spec.name}: {verdict.value}: {reason}" + (f" ({counts})" if counts else "")
    if parsed.dropped:
        summary += f"; {parsed.dropped} more failure signature(s) not listed"
    if verdict is Result.PASS:
        actions = ["No action needed: every step passed."]
    elif verdict is Result.INCONCLUSIVE:
        actions = ["Rerun in a working sandbox; this run proves nothing either way."]
    else:
        actions = [_clip(f"Fix {s.test_id or s.kind}: {s.excerpt}", NEXT_ACTION_MAX)
                   for s in parsed.signatures[:3]] or [
            _clip(f"Make step '{reason}' succeed; read the cited log lines.", NEXT_ACTION_MAX)]
    hyper: list[str] = []
    isolation = result.manifest.platform.isolation
    if isolation == "none":
        hyper.append("Ran without a sandbox (isolation none): the environment may be adversarial.")
    if verdict is Result.PASS and parsed.counts.run == 0:
        hyper.append("No test was collected: a PASS here covers nothing.")
    if parsed.truncated:
        hyper.append("Parser output was truncated; unlisted failures may exist.")
    if verdict is Result.INCONCLUSIVE:
        hyper.append("Inconclusive: cannot rule out either outcome.")
    confidence = {Result.PASS: 0.9, Result.FAIL: 0.95, Result.INCONCLUSIVE: 0.2,
                  Result.FLAKY: 0.4}[verdict]
    if isolation == "none":
        confidence = min(confidence, 0.7)
    return VerificationReport(
        verifier=spec.name, verifier_type=spec.kind.value, target=target, result=verdict,
        failure_signatures=tuple(parsed.signatures), signatures_truncated=parsed.dropped,
        summary=_clip(summary, SUMMARY_MAX), next_actions=tuple(actions[:3]),
        confidence=confidence, hyperthesis=tuple(hyper[:4]), counts=parsed.counts,
        parser=spec.parser, parser_truncated=parsed.truncated,
        artifacts={k: v for k, v in sorted(result.artifacts.items())
                   if k.startswith("logs/combined") or k.endswith(".xml")} | {
                       "manifest": result.manifest_hash},
    )


def parse_run(result: PipelineResult, spec: VerifierSpec, store: ArtifactStore) -> ParseResult:
    inp = ParseInput(artifacts=result.artifacts, store=store,
                     exit_codes=[r.exit_code for r in result.manifest.commands_executed])
    try:
        return get_parser(spec.parser)(inp)
    except Exception as exc:  # hostile input must not crash a run: fail closed instead
        return ParseResult(error=f"parser {spec.parser} crashed: {type(exc).__name__}")


async def abuild_report(result: PipelineResult, *, spec: VerifierSpec, store: ArtifactStore,
                        target: Target, reporter: str | None = None,
                        deadline_s: float = 30.0) -> VerificationReport:
    """The report for ``result``; with ``reporter`` set, worded by the cheap model."""
    parsed = parse_run(result, spec, store)
    verdict, reason = decide(result, parsed, spec.parser)
    report = deterministic_report(result, spec=spec, target=target, parsed=parsed,
                                  verdict=verdict, reason=reason)
    if reporter is None:
        return report
    from choir.report.model import model_report

    return await model_report(report, result=result, store=store, model=reporter,
                              deadline_s=deadline_s)
