"""The documented bound, enforced: no report is more than 4 KB of JSON, at every field's limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choir.models import (
    Citation,
    Counts,
    FailureSignature,
    Result,
    Target,
    VerificationReport,
)
from choir.models.report import (
    EXCERPT_MAX,
    HYPERTHESIS_MAX,
    MAX_SIGNATURES,
    NEXT_ACTION_MAX,
    REPORT_MAX_BYTES,
    SUMMARY_MAX,
)
from choir.report.bound import fit


def _fields(char: str = "x", sigs: int = MAX_SIGNATURES) -> dict[str, object]:
    sig = [FailureSignature(
        id=f"{i:064x}", kind="test_failure", test_id=char * 256, location=char * 256,
        excerpt=char * EXCERPT_MAX,
        citation=Citation(artifact="a" * 64, line_start=1, line_end=2, span_hash="b" * 64))
        for i in range(sigs)]
    return dict(
        verifier="v" * 64, verifier_type="unit_tests", target=Target(tree_hash="0" * 64),
        result=Result.FAIL, failure_signatures=tuple(sig), summary=char * SUMMARY_MAX,
        next_actions=tuple(char * NEXT_ACTION_MAX for _ in range(3)), confidence=0.9,
        hyperthesis=tuple(char * HYPERTHESIS_MAX for _ in range(4)),
        counts=Counts(run=9, failed=8), artifacts={f"out/{i:02d}.xml": "c" * 64 for i in range(15)}
        | {"manifest": "d" * 64})


def test_every_field_at_its_limit_was_over_12_kb_and_is_refused_unfitted() -> None:
    oversized = VerificationReport.model_construct(**_fields())
    assert len(oversized.model_dump_json().encode()) > 3 * REPORT_MAX_BYTES
    with pytest.raises(ValueError, match="the bound is 4096"):
        VerificationReport.model_validate(oversized.model_dump())


@pytest.mark.parametrize("char", ["x", "é", "😀"])  # 1, 2 and 4 bytes of UTF-8 each
def test_fit_keeps_the_result_and_counts_and_says_how_many_signatures_went(char: str) -> None:
    report = fit(VerificationReport.model_construct(**_fields(char)))
    assert len(report.model_dump_json().encode()) <= REPORT_MAX_BYTES
    assert report.result is Result.FAIL and report.counts.failed == 8
    assert len(report.failure_signatures) + report.signatures_truncated == MAX_SIGNATURES
    assert report.failure_signatures  # the first failure is kept while anything else can go
    assert "manifest" in report.artifacts


def test_a_report_that_fits_is_returned_unchanged() -> None:
    small = VerificationReport(**{**_fields(sigs=1), "summary": "s", "hyperthesis": (),
                                  "next_actions": ("a",), "artifacts": {"manifest": "d" * 64}})
    assert fit(small) == small


@settings(max_examples=60, deadline=None)
@given(sigs=st.integers(0, MAX_SIGNATURES), summary=st.integers(1, SUMMARY_MAX),
       char=st.sampled_from(["x", "ü", "漢", "😀"]))
def test_fit_always_lands_within_the_bound(sigs: int, summary: int, char: str) -> None:
    fields = _fields(char, sigs)
    fields["summary"] = char * summary
    report = fit(VerificationReport.model_construct(**fields))
    assert len(report.model_dump_json().encode()) <= REPORT_MAX_BYTES
