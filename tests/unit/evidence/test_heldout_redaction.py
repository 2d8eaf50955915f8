"""What the executor hears of a held-out check (review 20, finding 1).

The code under test runs in the held-out step and may read the held-out files, so every field
it or a reporter model can steer is a channel: ``confidence`` (a model's figure taken
unrounded), ``usage`` (prompt tokens grow with what the step prints), ``reporter`` and
``parser_truncated``. ``counts_only`` rebuilds the report from an allowlist, so none of them
(nor any field added later) reaches the executor."""

from __future__ import annotations

from choir.evidence.heldout import NEXT, counts_only
from choir.models import (
    Counts,
    FailureSignature,
    Result,
    Target,
    Usage,
    VerificationReport,
)
from choir.report.confidence import TABLE


def _leaky(result: Result) -> VerificationReport:
    return VerificationReport(
        verifier="hidden", verifier_type="unit_tests",
        target=Target(tree_hash="a" * 64, work_item="w"), result=result,
        summary="test_secret failed", next_actions=("look at test_secret",),
        confidence=0.065098,  # 'A' (65), 'b' (98) of a hidden test, as a model worded it
        hyperthesis=("secret Ab",), parser="junit", parser_truncated=True,
        failure_signatures=(FailureSignature(id="s1", kind="assertion", test_id="t::secret",
                                             excerpt="assert 7 == 6"),),
        signatures_truncated=3, counts=Counts(run=65, failed=98),
        artifacts={"logs/combined.log": "b" * 64}, reporter="sneaky.plugin-65",
        usage=Usage(model="openai/fake", prompt_tokens=689, completion_tokens=30,
                    cost_usd=0.0065))


def test_counts_only_keeps_nothing_the_step_or_a_model_could_steer() -> None:
    for result in Result:
        seen = counts_only(_leaky(result))
        assert seen.result is result
        assert (seen.verifier, seen.verifier_type, seen.parser) == ("hidden", "unit_tests", "junit")
        assert seen.target == Target(tree_hash="a" * 64, work_item="w")
        assert seen.confidence == TABLE[result]
        assert seen.usage == Usage()
        assert seen.reporter == "deterministic"
        assert seen.parser_truncated is False
        assert seen.summary == f"held-out check {result.value}"
        assert seen.next_actions == NEXT
        assert (seen.counts, seen.failure_signatures, seen.signatures_truncated,
                seen.hyperthesis, seen.artifacts) == (Counts(), (), 0, (), {})
        text = seen.model_dump_json()
        for leak in ("0.065098", "689", "sneaky", "secret", "openai"):
            assert leak not in text, leak


def test_the_heldout_table_is_the_report_table() -> None:
    """``choir.evidence`` sits below ``choir.report``, so it keeps its own copy of the table."""
    from choir.evidence.heldout import HELDOUT_CONFIDENCE

    assert HELDOUT_CONFIDENCE == TABLE
