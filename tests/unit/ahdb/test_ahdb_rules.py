"""The promotion rules (seed 002 §6): only valid attestations promote, nothing else can."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.evidence.tree import tree_hash
from choir.exceptions import PromotionError
from choir.models import AtomKind, AtomStatus
from tests.evidence import attest, make_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def claim(db, repo: Path, verifiers=("unit",)):  # type: ignore[no-untyped-def]
    return db.propose(claim="unit passes", work_item="wi", tree_hash=tree_hash(repo),
                      required_verifiers=verifiers)


def test_pass_attestation_promotes_and_assert_follows(repo: Path) -> None:
    db = open_ahdb()
    att = attest(repo, "unit", "true")
    atom = db.promote(claim(db, repo).id, [att.id])
    assert atom.status is AtomStatus.PROMOTED and atom.attestations == (att.id,)
    done = db.assert_work_item("wi", tree_hash(repo), references=[atom.id], claim="done")
    assert done.kind is AtomKind.ASSERT and done.attestations == (att.id,)
    assert db.is_asserted("wi", tree_hash(repo)) == done
    assert db.is_asserted("wi", "0" * 64) is None


def test_no_verifier_no_assert(repo: Path) -> None:
    db = open_ahdb()
    with pytest.raises(PromotionError, match="no verifier"):
        claim(db, repo, verifiers=())


def test_fail_attestation_cannot_promote(repo: Path) -> None:
    db = open_ahdb()
    att = attest(repo, "unit", "false")
    with pytest.raises(PromotionError, match="FAIL"):
        db.promote(claim(db, repo).id, [att.id])


def test_attestation_for_another_tree_cannot_promote(repo: Path, tmp_path: Path) -> None:
    other = make_repo(tmp_path / "other", "x = 2\n")
    db = open_ahdb()
    att = attest(other, "unit", "true")
    with pytest.raises(PromotionError, match="another tree"):
        db.promote(claim(db, repo).id, [att.id])


def test_every_required_verifier_must_pass(repo: Path) -> None:
    db = open_ahdb()
    unit = attest(repo, "unit", "true")
    with pytest.raises(PromotionError, match="lint"):
        db.promote(claim(db, repo, ("unit", "lint")).id, [unit.id])


def test_assert_needs_promoted_claims(repo: Path) -> None:
    db = open_ahdb()
    proposed = claim(db, repo)
    with pytest.raises(PromotionError, match="not a PROMOTED claim"):
        db.assert_work_item("wi", tree_hash(repo), references=[proposed.id], claim="done")
    with pytest.raises(PromotionError, match="without references"):
        db.assert_work_item("wi", tree_hash(repo), references=[], claim="done")


def test_fail_demotes_and_unasserts(repo: Path) -> None:
    db = open_ahdb()
    ok = attest(repo, "unit", "true")
    atom = db.promote(claim(db, repo).id, [ok.id])
    db.assert_work_item("wi", tree_hash(repo), references=[atom.id], claim="done")
    bad = attest(repo, "unit", "false")  # minting it logs its outcome, which demotes
    (demoted,) = [a for a in db.atoms("wi") if a.id == atom.id]
    assert demoted.status is AtomStatus.DEMOTED and bad.id in demoted.attestations
    assert db.is_asserted("wi", tree_hash(repo)) is None
    with pytest.raises(PromotionError, match="not a PROMOTED claim"):
        db.demote(atom.id, bad.id, "again")


def test_hypothesize_needs_fail_evidence_and_a_test(repo: Path) -> None:
    db = open_ahdb()
    bad = attest(repo, "unit", "false")
    h = db.hypothesize("wi", tree_hash(repo), claim="add subtracts",
                       discriminating_test="add(2, 3) == 5", attestation_ids=[bad.id])
    assert h.kind is AtomKind.HYPOTHESIZE
    with pytest.raises(PromotionError, match="discriminating test"):
        db.hypothesize("wi", tree_hash(repo), claim="x", discriminating_test="",
                       attestation_ids=[bad.id])
    ok = attest(repo, "unit", "true")
    with pytest.raises(PromotionError, match="PASS, not FAIL"):
        db.hypothesize("wi", tree_hash(repo), claim="x", discriminating_test="t",
                       attestation_ids=[ok.id])


def test_hyperthesis_authorises_nothing(repo: Path) -> None:
    db = open_ahdb()
    ok = attest(repo, "unit", "true")
    h = db.hyperthesis("wi", tree_hash(repo), claim="tests cover only add",
                       attestation_ids=[ok.id])
    with pytest.raises(PromotionError, match="cannot be promoted"):
        db.promote(h.id, [ok.id])
    with pytest.raises(PromotionError, match="not a PROMOTED claim"):
        db.assert_work_item("wi", tree_hash(repo), references=[h.id], claim="done")


def test_the_private_write_path_checks_too(repo: Path) -> None:
    """No function, public or private, writes an ASSERT without the check."""
    db = open_ahdb()
    forged = db._new(AtomKind.ASSERT, AtomStatus.PROMOTED, claim="done", work_item="wi",
                     tree_hash=tree_hash(repo), references=("f" * 32,), attestations=())
    with pytest.raises(PromotionError):
        db._append("assert", forged)
    with pytest.raises(PromotionError):
        db._append("promote", {"atom_id": "nope", "attestations": []})
    assert db.atoms() == []


def test_a_plan_declares_its_items_once(repo: Path) -> None:
    """What a plan's gate and release hold it to is its first list: a second ``plan``
    event (a shorter list, written later) is refused by the rules, and the replay that
    audit runs reads the same list (it took the union of every such event before)."""
    from choir.ahdb.rules import Replay, replay

    db = open_ahdb()
    db.declare_plan("p", ["a", "b"])
    with pytest.raises(PromotionError, match="already"):
        db._write("plan", {"plan": "p", "items": ["a"]})
    with pytest.raises(PromotionError, match="distinct items"):
        db._write("plan", {"plan": "q", "items": ["a", "a"]})
    assert db.plan_items("p") == {"a", "b"} and db.plan_items("q") is None
    state = Replay()
    replay(db.events(), state, db.attestation, lambda ev, exc: pytest.fail(str(exc)))
    assert state.declared("p") == {"a", "b"}


def test_forged_attestation_id_is_refused(repo: Path) -> None:
    db = open_ahdb()
    with pytest.raises(PromotionError, match="unavailable"):
        db.promote(claim(db, repo).id, ["a" * 64])


def test_log_is_append_only(repo: Path, ahdb_backend: str) -> None:
    db = open_ahdb()
    claim(db, repo)
    if ahdb_backend == "postgres":  # a second client, behind the store's back
        import os

        import psycopg

        with psycopg.connect(os.environ["CHOIR_DATABASE_URL"], autocommit=True) as pg:
            for sql in ("UPDATE events SET kind = 'assert'", "DELETE FROM events",
                        "TRUNCATE events", "DELETE FROM heads", "TRUNCATE heads"):
                with pytest.raises(psycopg.Error, match="append-only"):
                    pg.execute(sql)
            assert pg.execute("SELECT count(*) FROM events").fetchone() == (1,)
        return
    conn = sqlite3.connect(db.path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE events SET kind = 'assert'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM events")


def _writer(home: str, tree: str, n: int) -> None:
    import os

    os.environ["CHOIR_HOME"] = home
    os.environ["CHOIR_ARTIFACT_DIR"] = home + "/artifacts"
    db = open_ahdb()
    for i in range(n):
        db.propose(claim=f"c{i}", work_item="wi", tree_hash=tree, required_verifiers=["unit"])


def test_two_processes_writing_at_once_lose_nothing(repo: Path, choir_home: Path) -> None:
    from choir.ahdb import check_chain

    open_ahdb()  # create key and schema first
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(choir_home), tree_hash(repo), 60))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    db = open_ahdb()
    events = list(db.events())
    assert len(events) == 120 and len(db.atoms()) == 120
    assert check_chain(events) == []


def test_a_fail_logged_before_any_promotion_still_blocks_the_promotion(repo: Path) -> None:
    """The FAIL's outcome is on record before the claim is promoted: nothing to demote then,
    but a PASS of the same verifier on the same tree must not promote it afterwards."""
    db = open_ahdb()
    c = claim(db, repo)
    attest(repo, "unit", "false")  # logs the outcome; no claim is PROMOTED yet
    with pytest.raises(PromotionError, match="attested FAIL"):
        db.promote(c.id, [attest(repo, "unit", "true").id])
    assert db.failed_verifiers("wi", tree_hash(repo)) == {"unit"}
