"""A run id names one run: a sealed run is never run again, a killed one is set aside."""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError
from choir.models import StepSpec, Target, VerifierKind, VerifierSpec
from choir.sandbox import get_sandbox
from choir.verification.pipeline import PipelineResult, run_verifier
from tests.evidence import make_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def counter(tmp_path: Path) -> Path:
    return tmp_path / "ran.txt"


def spec(counter: Path, last: str = "true") -> VerifierSpec:
    steps = (StepSpec(name="count", command=f"echo ran >> '{counter}'; echo out"),
             StepSpec(name="last", command=last))
    return VerifierSpec(name="unit", kind=VerifierKind.UNIT_TESTS, steps=steps, timeout_s=30)


def run(store: ArtifactStore, repo: Path, counter: Path, run_id: str,
        last: str = "true") -> PipelineResult:
    return run_verifier(spec(counter, last), repo=repo, sandbox=get_sandbox("local"),
                        store=store, run_id=run_id, target=Target(tree_hash="0" * 64))


def runs_made(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


@pytest.mark.parametrize(("last", "status"), [("true", "PASS"), ("false", "FAIL")])
def test_a_sealed_run_id_runs_once_and_replays_its_result(
        store: ArtifactStore, repo: Path, counter: Path, last: str, status: str) -> None:
    first = run(store, repo, counter, "r1", last)
    again = run(store, repo, counter, "r1", last)
    assert runs_made(counter) == 1
    assert first.status == again.status == status
    assert again.manifest_hash == first.manifest_hash and again.artifacts == first.artifacts


def test_a_replayed_run_shows_the_same_tail_log(store: ArtifactStore, repo: Path,
                                                counter: Path) -> None:
    first = run(store, repo, counter, "r1", "false")
    assert run(store, repo, counter, "r1", "false").tail_log == first.tail_log


def test_a_killed_run_is_set_aside_and_the_run_starts_over(
        store: ArtifactStore, repo: Path, counter: Path) -> None:
    partial = store.run_dir("r1") / "logs" / "partial.log"
    partial.parent.mkdir(parents=True)
    partial.write_text("half a log\n")
    result = run(store, repo, counter, "r1")
    assert result.status == "PASS" and runs_made(counter) == 1
    assert "logs/partial.log" not in result.artifacts
    aborted = list((store.root / "aborted").iterdir())
    assert [p.name.split(".")[0] for p in aborted] == ["r1"]
    assert (aborted[0] / "logs" / "partial.log").read_text() == "half a log\n"
    sealed = store.sealed("r1")
    assert sealed is not None and sealed[1] == result.manifest_hash


def test_a_manifest_that_does_not_parse_refuses_the_run(
        store: ArtifactStore, repo: Path, counter: Path) -> None:
    store.run_dir("r1").mkdir(parents=True)
    (store.run_dir("r1") / "manifest.json").write_text("{not json")
    with pytest.raises(IntegrityError, match="does not parse"):
        run(store, repo, counter, "r1")
    assert runs_made(counter) == 0


def test_a_run_id_of_another_verifier_or_tree_is_refused_not_reused(
        store: ArtifactStore, repo: Path, counter: Path) -> None:
    unit = spec(counter)
    lint = unit.model_copy(update={"name": "lint", "kind": VerifierKind.LINT})

    def go(which: VerifierSpec, tree: str) -> PipelineResult:
        return run_verifier(which, repo=repo, sandbox=get_sandbox("local"), store=store,
                            run_id="same", target=Target(tree_hash=tree * 64))

    go(unit, "1")
    with pytest.raises(IntegrityError, match="already names a run of 'unit'"):
        go(lint, "1")
    with pytest.raises(IntegrityError, match="already names a run of 'unit' on tree 111"):
        go(unit, "2")
    assert runs_made(counter) == 1


@pytest.mark.parametrize("change", ["command", "name", "more_steps"])
def test_a_run_id_of_other_commands_is_refused_not_replayed_as_their_result(
        store: ArtifactStore, repo: Path, counter: Path, change: str) -> None:
    """Same verifier name, same tree, other steps (a shared artifact store, another runner's
    configuration, a reused --run-id): the stored PASS of ``true`` must never stand for
    ``false``."""
    passing = run(store, repo, counter, "same", "true")
    assert passing.status == "PASS"
    other = spec(counter, "false")
    if change == "name":
        steps = (other.steps[0], other.steps[1].model_copy(update={"name": "renamed",
                                                                    "command": "true"}))
        other = other.model_copy(update={"steps": steps})
    elif change == "more_steps":
        steps = (*spec(counter).steps, StepSpec(name="extra", command="false"))
        other = other.model_copy(update={"steps": steps})
    with pytest.raises(IntegrityError, match="other steps"):
        run_verifier(other, repo=repo, sandbox=get_sandbox("local"), store=store,
                     run_id="same", target=Target(tree_hash="0" * 64))
    assert runs_made(counter) == 1
