"""Issue #11 item 5: a later attested FAIL on the same tree demotes the ASSERT it contradicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.exceptions import PromotionError
from choir.models import AtomKind, AtomStatus
from choir.tree import tree_hash
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
    return subprocess.run([sys.executable, "-m", "choir", "gate", "wi", "--repo", str(repo)],
                          capture_output=True, text=True, timeout=60).returncode


def audit() -> tuple[int, set[str]]:
    proc = subprocess.run([sys.executable, "-m", "choir", "audit", "--json"],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, {v["kind"] for v in json.loads(proc.stdout)["violations"]}


def test_a_later_attested_fail_on_the_same_tree_demotes_and_the_gate_fails(
        repo: Path, choir_home: Path) -> None:
    claim_id = asserted(repo)
    assert gate(repo) == 0
    bad = attest(repo, "unit", "false")
    open_ahdb().hypothesize("wi", tree_hash(repo), claim="unit fails after all",
                            discriminating_test="rerun unit", attestation_ids=[bad.id])
    db = open_ahdb()
    assert db.is_asserted("wi", tree_hash(repo)) is None
    (claim,) = [a for a in db.atoms("wi", AtomKind.ASSERT) if a.id == claim_id]
    assert claim.status is AtomStatus.DEMOTED and bad.id in claim.attestations
    assert gate(repo) == 1
    assert audit() == (0, set())


def test_demote_failed_covers_fails_without_a_hypothesis(repo: Path, choir_home: Path) -> None:
    asserted(repo)
    bad = attest(repo, "unit", "false")
    demoted = open_ahdb().demote_failed("wi", tree_hash(repo), [bad.id])
    assert [a.status for a in demoted] == [AtomStatus.DEMOTED]
    assert open_ahdb().demote_failed("wi", tree_hash(repo), [bad.id]) == []  # idempotent
    assert gate(repo) == 1


def test_a_fail_of_a_verifier_the_claim_does_not_need_demotes_nothing(
        repo: Path, choir_home: Path) -> None:
    asserted(repo)
    lint = attest(repo, "lint", "false")
    assert open_ahdb().demote_failed("wi", tree_hash(repo), [lint.id]) == []
    with pytest.raises(PromotionError, match="not required"):
        db = open_ahdb()
        (claim,) = [a for a in db.atoms("wi", AtomKind.ASSERT) if not a.references]
        db.demote(claim.id, lint.id, "lint failed")
    assert gate(repo) == 0


def test_pass_after_an_attested_fail_still_never_promotes(repo: Path, choir_home: Path) -> None:
    claim_id = asserted(repo)
    bad = attest(repo, "unit", "false")
    open_ahdb().demote_failed("wi", tree_hash(repo), [bad.id])
    db = open_ahdb()
    again = db.propose(claim="unit passes", work_item="wi", tree_hash=tree_hash(repo),
                       required_verifiers=["unit"])
    assert again.id != claim_id
    with pytest.raises(PromotionError, match="attested FAIL"):
        db.promote(again.id, [attest(repo, "unit", "true").id])


def test_audit_names_an_assert_that_a_stored_fail_contradicts(
        repo: Path, choir_home: Path) -> None:
    """A FAIL attestation minted (e.g. by ``choir verify``) but never applied to the AHDB."""
    asserted(repo)
    attest(repo, "unit", "false")
    code, kinds = audit()
    assert code == 1 and "ahdb_contradicted" in kinds, kinds
