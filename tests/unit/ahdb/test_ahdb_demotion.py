"""Issue #11 item 5: a later attested FAIL on the same tree demotes the ASSERT it contradicts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.evidence.tree import tree_hash
from choir.exceptions import PromotionError
from choir.models import AtomKind, AtomStatus
from tests import forked
from tests.evidence import attest, make_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def asserted(repo: Path, verifiers: tuple[str, ...] = ("unit",)) -> str:
    db = open_ahdb()
    claim = db.propose(claim="unit passes", work_item="wi", tree_hash=tree_hash(repo),
                       required_verifiers=verifiers)
    claim = db.promote(claim.id, [attest(repo, v, "true").id for v in verifiers])
    db.assert_work_item("wi", tree_hash(repo), references=[claim.id], claim="done")
    assert db.is_asserted("wi", tree_hash(repo)) is not None
    return claim.id


def gate(repo: Path) -> int:
    return forked.run([sys.executable, "-m", "choir", "gate", "wi", "--repo", str(repo)],
                      capture_output=True, text=True, timeout=60).returncode


def audit() -> tuple[int, set[str]]:
    proc = forked.run([sys.executable, "-m", "choir", "audit", "--json"],
                      capture_output=True, text=True, timeout=120)
    return proc.returncode, {v["kind"] for v in json.loads(proc.stdout)["violations"]}


def claim_status(claim_id: str) -> AtomStatus:
    (claim,) = [a for a in open_ahdb().atoms("wi", AtomKind.ASSERT) if a.id == claim_id]
    return claim.status


def test_a_later_attested_fail_on_the_same_tree_demotes_and_the_gate_fails(
        repo: Path, choir_home: Path) -> None:
    claim_id = asserted(repo)
    assert gate(repo) == 0
    bad = attest(repo, "unit", "false")
    open_ahdb().hypothesize("wi", tree_hash(repo), claim="unit fails after all",
                            discriminating_test="rerun unit", attestation_ids=[bad.id])
    db = open_ahdb()
    assert db.is_asserted("wi", tree_hash(repo)) is None
    assert claim_status(claim_id) is AtomStatus.DEMOTED
    assert gate(repo) == 1
    assert audit() == (0, set())


def test_a_fail_from_choir_verify_with_no_work_item_demotes_too(
        repo: Path, choir_home: Path) -> None:
    claim_id = asserted(repo)
    attest(repo, "unit", "false", work_item=None)
    assert claim_status(claim_id) is AtomStatus.DEMOTED
    assert gate(repo) == 1


def test_demote_failed_is_idempotent(repo: Path, choir_home: Path) -> None:
    asserted(repo)
    bad = attest(repo, "unit", "false")
    assert open_ahdb().demote_failed("wi", tree_hash(repo), [bad.id]) == []
    assert len([e for e in open_ahdb().events() if e.kind == "demote"]) == 1


def test_a_fail_of_a_verifier_the_claim_does_not_need_demotes_nothing(
        repo: Path, choir_home: Path) -> None:
    claim_id = asserted(repo)
    lint = attest(repo, "lint", "false")
    assert open_ahdb().demote_failed("wi", tree_hash(repo), [lint.id]) == []
    with pytest.raises(PromotionError, match="not required"):
        open_ahdb().demote(claim_id, lint.id, "lint failed")
    assert gate(repo) == 0


def test_a_fail_on_another_tree_demotes_nothing(repo: Path, tmp_path: Path,
                                                choir_home: Path) -> None:
    claim_id = asserted(repo)
    other = make_repo(tmp_path / "other", "x = 2\n")
    attest(other, "unit", "false")
    assert claim_status(claim_id) is AtomStatus.PROMOTED and gate(repo) == 0


def test_pass_after_an_attested_fail_still_never_promotes(repo: Path, choir_home: Path) -> None:
    claim_id = asserted(repo)
    attest(repo, "unit", "false")
    db = open_ahdb()
    again = db.propose(claim="unit passes", work_item="wi", tree_hash=tree_hash(repo),
                       required_verifiers=["unit"])
    assert again.id != claim_id
    with pytest.raises(PromotionError, match="attested FAIL"):
        db.promote(again.id, [attest(repo, "unit", "true").id])


def test_audit_names_an_assert_that_a_stored_fail_contradicts(
        repo: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FAIL minted and stored, but never logged (a crash between the two, or an edit)."""
    from choir.ahdb.store import AHDB

    asserted(repo)
    monkeypatch.setattr(AHDB, "record_outcome", lambda self, att_id: None)
    attest(repo, "unit", "false")
    code, kinds = audit()
    assert code == 1 and {"ahdb_contradicted", "ahdb_outcome_missing"} <= kinds, kinds
