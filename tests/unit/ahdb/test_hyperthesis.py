"""Issue #11 item 6: every FLAKY, INCONCLUSIVE or partial-scope outcome leaves a HYPERTHESIS.

The adjudicate step's recording (``_record``) over real attestations, real runs' reports and
a real AHDB; only the round's state is assembled by hand, as the orchestrator would hold it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from choir.ahdb import open_ahdb
from choir.director import Decision, verdicts
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import tree_hash
from choir.graph.adjudicate import _record
from choir.models import Atom, AtomKind, Mood, Result, Target, VerificationReport, WorkItem
from choir.models.run import VerifierRun
from tests.evidence import attest, make_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def run(repo: Path, n: int, command: str, *, tests: tuple[str, ...] = (),
        diagnostic: bool = False) -> tuple[VerifierRun, str]:
    att = attest(repo, "unit", command)
    report = VerificationReport.model_validate_json(
        ArtifactStore().read_bytes(att.body.report_hash))
    return VerifierRun(verifier="unit", run_id=f"R-r0-unit-{n}", replica=n, report=report,
                       report_hash=att.body.report_hash, manifest_hash=att.body.manifest_hash,
                       tests=tests, diagnostic=diagnostic), att.id


def crashed(repo: Path) -> VerifierRun:
    report = VerificationReport(
        verifier="unit", verifier_type="crashed", target=Target(tree_hash=tree_hash(repo)),
        result=Result.INCONCLUSIVE, summary="verifier crashed: KeyError", confidence=0.0,
        next_actions=("Rerun",), hyperthesis=("The verifier crashed: nothing was ruled out.",))
    return VerifierRun(verifier="unit", run_id="R-r0-unit-9", report=report, report_hash="",
                       manifest_hash="")


def record(repo: Path, runs: list[tuple[VerifierRun, str] | VerifierRun],
           action: str = "nested") -> list[Atom]:
    pairs = [r if isinstance(r, tuple) else (r, "") for r in runs]
    state: dict[str, Any] = {
        "work_item": WorkItem(id="wi", goal="g", repo=str(repo)),
        "runs": [r for r, _ in pairs], "attestations": {r.run_id: a for r, a in pairs if a},
        "target": Target(work_item="wi", tree_hash=tree_hash(repo)), "run_id": "R",
        "round": 0}
    results = verdicts(state["runs"])
    _record(open_ahdb(), state, Decision(action, Mood.CALM, "test"),  # type: ignore[arg-type]
            results, "R/wi/1")
    return open_ahdb().atoms("wi", AtomKind.HYPERTHESIS)


def test_a_flaky_verdict_leaves_a_hyperthesis_naming_it(repo: Path) -> None:
    ok, bad = run(repo, 1, "true"), run(repo, 2, "false")
    (h,) = record(repo, [ok, bad])
    assert "FLAKY" in h.claim and set(h.attestations) == {ok[1], bad[1]}


def test_a_crashed_green_thread_leaves_a_hyperthesis(repo: Path) -> None:
    (h,) = record(repo, [crashed(repo)])
    assert "crashed" in h.claim and h.attestations == ()


def test_a_partial_scope_run_leaves_a_hyperthesis(repo: Path) -> None:
    ok = run(repo, 1, "true")
    subset = run(repo, 2, "true", tests=("test_calc.py::test_add",), diagnostic=True)
    (h,) = record(repo, [ok, subset], action="retry")
    assert "selected test" in h.claim and h.attestations == (subset[1],)


def test_a_plain_pass_discloses_nothing_and_a_hyperthesis_authorises_nothing(
        repo: Path) -> None:
    assert record(repo, [run(repo, 1, "true")], action="retry") == []
    (h,) = record(repo, [crashed(repo)])
    assert open_ahdb().is_asserted("wi") is None and h.status.value == "PROPOSED"
