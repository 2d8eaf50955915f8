"""The ``postcondition`` report parser: the harness's record, read for detail only.

The verdict is the harness's exit code (0 pass, 1 fail, 3 inconclusive), decided after the
verifier's process is dead. ``out/postcondition.json`` only words the report; a record that
is missing or disagrees with the exit code (something rewrote it) is an ``error``, which can
lower the result to INCONCLUSIVE and never raise it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from choir.models import Counts, FailureSignature, Result
from choir.report.parsers import ParseInput, ParseResult, _cite, _excerpt, _find_line
from choir.report.signatures import canonicalize, signature_id

if TYPE_CHECKING:
    from choir.verification.pipeline import PipelineResult

RECORD = "out/postcondition.json"
EXIT_OF = {"pass": 0, "fail": 1, "inconclusive": 3}
OUTCOME_OF = {code: outcome for outcome, code in EXIT_OF.items()}


def read_record(inp: ParseInput) -> dict[str, object] | None:
    digest = inp.artifacts.get(RECORD)
    if digest is None:
        return None
    try:
        data = json.loads(inp.store.read_bytes(digest, limit=1 << 16))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def parse_postcondition(inp: ParseInput) -> ParseResult:
    result = ParseResult()
    code = inp.exit_codes[-1] if inp.exit_codes else None
    record = read_record(inp)
    if record is None or code not in OUTCOME_OF or record.get("outcome") != OUTCOME_OF[code]:
        result.error = "the postcondition record is missing or disagrees with the exit code"
        result.counts = Counts(run=1, errors=1)
        return result
    outcome = OUTCOME_OF[code]
    result.counts = Counts(run=1, failed=int(outcome == "fail"),
                           errors=int(outcome == "inconclusive"))
    if outcome == "pass":
        return result
    detail = str(record.get("detail", ""))
    severity = str(record.get("severity") or "")
    line = _find_line(inp, f"[choir] postcondition {record.get('verifier')}: ")
    result.add(FailureSignature(
        id=signature_id("postcondition", str(record.get("verifier")), None,
                        f"{outcome}:{record.get('method')}:{canonicalize(detail)}"),
        kind=f"postcondition_{outcome}",
        test_id=str(record.get("verifier"))[:256],
        excerpt=_excerpt(f"{outcome} ({severity}): {detail}"),
        citation=_cite(inp, "logs/combined.log", line, line) if line else None))
    return result


def verdict_detail(inp_detail: ParseResult) -> str:
    """The verifier's own words for the report's reason (bounded)."""
    sig = inp_detail.signatures[0] if inp_detail.signatures else None
    return sig.excerpt if sig is not None else ""


def decide_postcondition(result: PipelineResult, parsed: ParseResult) -> tuple[Result, str]:
    """The verdict of a postcondition run, from the harness's exit code alone.

    Anything but a clean 0 or 1 (a hang the host had to stop, OOM, a missing interpreter, a
    crashed harness, a record rewritten behind the harness) is INCONCLUSIVE: no evidence
    either way, so never a PASS and never a promotion.
    """
    records = result.manifest.commands_executed
    if not records:
        return Result.INCONCLUSIVE, "no step ran"
    rec = records[-1]
    detail = verdict_detail(parsed)
    if rec.timed_out or rec.oom_killed or rec.limit_exceeded:
        why = ("timed out" if rec.timed_out else "ran out of memory" if rec.oom_killed
               else str(rec.limit_exceeded))
        return Result.INCONCLUSIVE, f"the postcondition harness {why}"
    if rec.exit_code not in OUTCOME_OF:
        return Result.INCONCLUSIVE, (f"the postcondition harness exited {rec.exit_code}: "
                                     "the check did not run")
    if parsed.error:
        return Result.INCONCLUSIVE, parsed.error
    outcome = OUTCOME_OF[rec.exit_code]
    if outcome == "pass":
        return Result.PASS, "the postcondition holds"
    verdict = Result.FAIL if outcome == "fail" else Result.INCONCLUSIVE
    return verdict, detail or f"postcondition {outcome}"
