"""CONFIDENCE calibrated from the verifier's history in the AHDB, the isolation and the lens;
never above the deterministic table. On the old code it was the constant table."""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.attest import AttestationStore
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import tree_hash
from choir.models import Result, VerificationReport, VerifierHistory
from choir.models.report import REPORT_MAX_BYTES
from choir.report.confidence import TABLE, calibrate
from tests.evidence import attest, make_repo


@pytest.mark.parametrize("verdict", list(TABLE))
@pytest.mark.parametrize("isolation", ["namespace", "none"])
@pytest.mark.parametrize("lens", ["default", "isolated_subset", "clean_rerun"])
@pytest.mark.parametrize("history", [None, VerifierHistory(trees=1, reversals=1),
                                     VerifierHistory(trees=10, reversals=0),
                                     VerifierHistory(trees=4, reversals=1),
                                     VerifierHistory(trees=3, reversals=9)])
def test_calibration_never_rises_above_the_table(verdict: Result, isolation: str, lens: str,
                                                  history: VerifierHistory | None) -> None:
    value, basis = calibrate(verdict, isolation=isolation, lens=lens, history=history)
    assert 0.0 <= value <= TABLE[verdict]
    if isolation == "none":
        assert value <= 0.7
    assert basis.startswith(f"Confidence {value:.2f}: table")


def test_a_verifier_that_reversed_is_trusted_less_and_says_why() -> None:
    value, basis = calibrate(Result.PASS, isolation="namespace",
                             history=VerifierHistory(trees=5, reversals=1))
    assert value == 0.72
    assert "reversed on 1 of 5 trees" in basis


def test_the_ahdb_counts_a_reversal_and_the_report_shows_the_basis(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    db = open_ahdb()
    for n in range(3):  # three trees where unit passed
        (repo / "mod.py").write_text(f"x = {n}\n")
        claim = db.propose(claim="c", work_item="wi", tree_hash=tree_hash(repo),
                           required_verifiers=["unit"])
        db.promote(claim.id, [attest(repo, "unit", "true").id])
    # ... and on the last it then failed: PASS then FAIL on the same tree
    bad = attest(repo, "unit", "false")
    db.demote_failed("wi", tree_hash(repo), [bad.id])
    assert db.verifier_history("unit") == VerifierHistory(trees=3, reversals=1)
    att = attest(repo, "unit", "true")  # a real run: its report is calibrated
    report = VerificationReport.model_validate_json(
        ArtifactStore().read_bytes(att.body.report_hash))
    # the local sandbox is isolation none (at most 0.7), and unit reversed on 1 of 3 trees
    assert report.confidence == pytest.approx(0.7 * (1 - 1 / 3), abs=0.01)
    assert any("reversed on 1 of 3 trees" in h for h in report.hyperthesis)
    assert len(report.model_dump_json().encode()) <= REPORT_MAX_BYTES
    assert AttestationStore().get(att.id).body.result is Result.PASS
