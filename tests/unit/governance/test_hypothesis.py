"""HYPOTHESIZE from the evidence (what fails, where the change is, the exact isolating
command), and its resolution by a later round, checked by the rules and re-derived by audit.
On the old code every FAIL recorded "the change does not yet meet: {goal}" and "rerun
{test}; it must pass"."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.director.hypothesis import derive
from choir.evidence.tree import tree_hash
from choir.exceptions import PromotionError
from choir.models import AtomStatus, Result, WorkItem
from tests.evidence import attest, make_repo
from tests.unit.ahdb.test_ahdb_demotion import audit
from tests.unit.director.test_director_adjudicate import repo_config, report, vrun


def test_the_hypothesis_names_tests_signatures_files_and_the_isolating_command(
        tmp_path: Path) -> None:
    specs = repo_config(tmp_path / "repo").verifiers
    run = vrun("unit", Result.FAIL, tests=("tests/t.py::test_add", "tests/t.py::test it's"))
    run = run.model_copy(update={"report": report(
        "unit", Result.FAIL, tests=("tests/t.py::test_add", "tests/t.py::test it's"),
        excerpt="assert 5 == 6")})
    item = WorkItem(id="wi", goal="add works", repo=".")
    hyp = derive(item, [run, vrun("lint", Result.PASS)], {"unit": Result.FAIL,
                                                          "lint": Result.PASS},
                 specs, ["calc.py"])
    assert hyp is not None
    assert "tests/t.py::test_add (assertion: assert 5 == 6)" in hyp.claim
    assert "the attempt changed calc.py" in hyp.claim and "add works" in hyp.claim
    command = hyp.discriminating_test.split("`")[1]
    assert shlex.split(command) == ["pytest", "-q", "tests/t.py::test_add",
                                    "tests/t.py::test it's"]
    assert hyp.verifiers == ("unit",)


def test_a_verifier_without_isolation_is_rerun_whole_and_flaky_asks_for_agreement(
        tmp_path: Path) -> None:
    specs = repo_config(tmp_path / "repo").verifiers
    item = WorkItem(id="wi", goal="g", repo=".")
    hyp = derive(item, [vrun("lint", Result.FAIL), vrun("unit", Result.PASS),
                        vrun("unit", Result.FAIL, replica=1)],
                 {"lint": Result.FAIL, "unit": Result.FLAKY}, specs, [])
    assert hyp is not None
    assert "lint: `true` exits non-zero now and must exit 0" in hyp.discriminating_test
    assert "rerun unit in clean sandboxes: it must pass every time" in hyp.discriminating_test
    assert "changed no file" in hyp.claim and "unit is nondeterministic" in hyp.claim
    assert derive(item, [], {"lint": Result.PASS}, specs, []) is None


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def hypothesis(repo: Path) -> str:
    bad = attest(repo, "unit", "false")
    return open_ahdb().hypothesize("wi", tree_hash(repo), claim="unit fails on t::a",
                                   discriminating_test="`pytest -q t::a` must pass",
                                   attestation_ids=[bad.id]).id


def test_a_later_tree_that_passes_confirms_it_and_audit_agrees(repo: Path) -> None:
    atom = hypothesis(repo)
    (repo / "mod.py").write_text("x = 2\n")
    good = attest(repo, "unit", "true")
    db = open_ahdb()
    with pytest.raises(PromotionError, match="not one the hypothesis explains"):
        db.resolve_hypothesis(atom, attest(repo, "lint", "true").id)
    resolved = db.resolve_hypothesis(atom, good.id)
    assert resolved.status is AtomStatus.PROMOTED
    assert db.resolve_hypothesis(atom, good.id) == resolved  # a replay appends nothing
    assert [e.kind for e in db.events()].count("resolve") == 1
    assert audit() == (0, set())


def test_a_pass_on_its_own_tree_refutes_it(repo: Path) -> None:
    atom = hypothesis(repo)
    resolved = open_ahdb().resolve_hypothesis(atom, attest(repo, "unit", "true").id)
    assert resolved.status is AtomStatus.DEMOTED
    assert audit() == (0, set())


def test_the_rules_refuse_a_verdict_the_evidence_does_not_give(repo: Path) -> None:
    atom = hypothesis(repo)
    db = open_ahdb()
    same_tree_pass = attest(repo, "unit", "true").id
    with pytest.raises(PromotionError, match="says refuted"):
        db._append("resolve", {"atom_id": atom, "attestation": same_tree_pass,
                               "verdict": "confirmed"})
    with pytest.raises(PromotionError, match="not PASS"):
        db._append("resolve", {"atom_id": atom, "attestation": attest(repo, "unit", "false").id,
                               "verdict": "refuted"})
