"""Keyed AHDB writes: a resumed run replaying its last node appends nothing new."""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.ahdb.store import AHDB
from choir.evidence.tree import tree_hash
from choir.exceptions import PromotionError
from choir.models import Atom, AtomStatus
from tests.evidence import attest, make_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def events(db: AHDB) -> int:
    """Events other than minted attestations' outcomes (each ``attest`` logs one)."""
    return len([e for e in db.events() if e.kind != "outcome"])


def claim(db: AHDB, repo: Path, key: str | None) -> Atom:
    return db.propose(claim="unit passes", work_item="wi", tree_hash=tree_hash(repo),
                      required_verifiers=["unit"], key=key)


def test_a_keyed_proposal_written_twice_is_one_event(repo: Path) -> None:
    db = open_ahdb()
    first, again = claim(db, repo, "run1/claim"), claim(db, repo, "run1/claim")
    assert again.id == first.id and events(db) == 1
    assert [a.id for a in db.atoms()] == [first.id]


def test_a_different_key_is_a_different_atom(repo: Path) -> None:
    db = open_ahdb()
    assert claim(db, repo, "run1/claim").id != claim(db, repo, "run2/claim").id
    assert events(db) == 2


def test_unkeyed_writes_are_never_merged(repo: Path) -> None:
    db = open_ahdb()
    assert claim(db, repo, None).id != claim(db, repo, None).id
    assert events(db) == 2


def test_a_replayed_promotion_appends_nothing(repo: Path) -> None:
    db = open_ahdb()
    att = attest(repo, "unit", "true")
    atom_id = claim(db, repo, "k/claim").id
    promoted = db.promote(atom_id, [att.id])
    replayed = db.promote(atom_id, [att.id])
    assert replayed.status is AtomStatus.PROMOTED and replayed.id == promoted.id
    assert replayed.attestations == (att.id,) and events(db) == 2


def test_a_promotion_with_other_evidence_is_not_a_replay(repo: Path) -> None:
    db = open_ahdb()
    first, second = attest(repo, "unit", "true"), attest(repo, "unit", "true")
    atom_id = claim(db, repo, "k/claim").id
    db.promote(atom_id, [first.id])
    with pytest.raises(PromotionError, match="cannot be promoted"):
        db.promote(atom_id, [second.id])
    assert events(db) == 2


def test_a_keyed_assert_written_twice_is_one_event(repo: Path) -> None:
    db = open_ahdb()
    att = attest(repo, "unit", "true")
    promoted = db.promote(claim(db, repo, "k/claim").id, [att.id])
    first, again = (db.assert_work_item("wi", tree_hash(repo), references=[promoted.id],
                                        claim="done", key="k/assert") for _ in range(2))
    assert again.id == first.id and events(db) == 3
    assert db.is_asserted("wi", tree_hash(repo)) == first


def test_keyed_hypothesis_and_hyperthesis_written_twice_are_one_event_each(repo: Path) -> None:
    db = open_ahdb()
    att = attest(repo, "unit", "false")
    tree = tree_hash(repo)
    for _ in range(2):
        hypo = db.hypothesize("wi", tree, claim="add subtracts", discriminating_test="t::add",
                              attestation_ids=[att.id], key="k/hypothesize")
        hyper = db.hyperthesis("wi", tree, claim="only two inputs are tested",
                               attestation_ids=[att.id], key="k/hyperthesis")
    assert events(db) == 2 and hypo.id != hyper.id
    assert {a.id for a in db.atoms()} == {hypo.id, hyper.id}


def test_a_proposal_and_an_assert_under_one_key_stay_two_atoms(repo: Path) -> None:
    db = open_ahdb()
    proposed = claim(db, repo, "run1/x")
    att = attest(repo, "unit", "true")
    db.promote(proposed.id, [att.id])
    asserted = db.assert_work_item("wi", tree_hash(repo), references=[proposed.id],
                                   claim="wi done", key="run1/x")
    assert asserted.id != proposed.id and asserted.references == (proposed.id,)
    assert events(db) == 3


def test_a_verifier_with_an_attested_fail_on_a_tree_cannot_promote_it_later(
        repo: Path) -> None:
    """A tree does not change: a PASS after a recorded FAIL is disagreement, not progress."""
    db = open_ahdb()
    tree = tree_hash(repo)
    failed = attest(repo, "unit", "false")
    db.hypothesize("wi", tree, claim="not yet", discriminating_test="rerun unit",
                   attestation_ids=[failed.id])
    assert db.failed_verifiers("wi", tree) == {"unit"}
    assert db.failed_verifiers("other-item", tree) == {"unit"}  # the tree, whoever looked
    proposed = claim(db, repo, None)
    with pytest.raises(PromotionError, match="attested FAIL on this tree"):
        db.promote(proposed.id, [attest(repo, "unit", "true").id])
