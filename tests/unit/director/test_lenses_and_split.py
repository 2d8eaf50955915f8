"""Lenses (what a nested run executes, which runs a nested round makes) and splitting."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from choir.director.lenses import lens_spec, nested_plan
from choir.director.split import MAX_PARTS, part_feedback, split_parts
from choir.models import PlannedVerifier, Result, VerifierSpec, WorkItem
from choir.models.run import VerifierRun
from tests.unit.director.test_director_adjudicate import repo_config, report, vrun


@pytest.fixture
def specs(tmp_path: Path) -> dict[str, VerifierSpec]:
    return repo_config(tmp_path / "repo").verifiers


def item(item_id: str = "wi") -> WorkItem:
    return WorkItem(id=item_id, goal="make it work", repo=".", required_verifiers=("unit",))


# -- lens_spec -----------------------------------------------------------------------------

def test_instrumented_adds_its_environment_and_names_the_lens(
        specs: dict[str, VerifierSpec]) -> None:
    spec = specs["unit"].model_copy(update={"env": {"KEEP": "1"}})
    seen = lens_spec(spec, PlannedVerifier(name="unit", lens="instrumented"))
    assert seen.env == {"KEEP": "1", "PYTHONFAULTHANDLER": "1", "CHOIR_LENS": "instrumented"}
    assert seen.steps == spec.steps


def test_isolated_subset_replaces_only_the_last_step_with_quoted_tests(
        specs: dict[str, VerifierSpec]) -> None:
    tests = ("tests/a.py::test one", "tests/b.py::it's", "t::$(touch pwned)")
    spec = specs["unit"]
    seen = lens_spec(spec, PlannedVerifier(name="unit", lens="isolated_subset", tests=tests))
    assert seen.steps[:-1] == spec.steps[:-1] and len(seen.steps) == len(spec.steps)
    assert shlex.split(seen.steps[-1].command) == ["pytest", "-q", *tests]
    assert seen.env["CHOIR_LENS"] == "isolated_subset"


@pytest.mark.parametrize("lens", ["default", "clean_rerun"])
def test_default_and_clean_rerun_run_the_spec_unchanged(specs: dict[str, VerifierSpec],
                                                        lens: str) -> None:
    planned = PlannedVerifier.model_validate({"name": "unit", "lens": lens, "replica": 1})
    assert lens_spec(specs["unit"], planned) == specs["unit"]


# -- nested_plan ---------------------------------------------------------------------------

def lenses_of(planned: list[PlannedVerifier]) -> list[tuple[str, str, bool]]:
    return [(p.name, p.lens, p.diagnostic) for p in planned]


def test_flaky_gets_clean_reruns_instrumentation_isolation_and_an_independent_check(
        specs: dict[str, VerifierSpec]) -> None:
    runs = [vrun("unit", Result.PASS), vrun("unit", Result.FAIL, replica=1, tests=("t::a",))]
    planned = nested_plan({"unit": Result.FLAKY}, runs, specs)
    assert lenses_of(planned) == [
        ("unit", "clean_rerun", False), ("unit", "clean_rerun", False),
        ("unit", "instrumented", True), ("unit", "isolated_subset", True),
        ("lint", "independent", False)]
    assert planned[3].tests == ("t::a",) and planned[4].checks == "unit"


def test_flaky_without_isolate_or_failing_tests_has_no_isolated_run(
        specs: dict[str, VerifierSpec]) -> None:
    lint = [vrun("lint", Result.PASS), vrun("lint", Result.FAIL, replica=1, tests=("t::a",))]
    unit = [vrun("unit", Result.PASS), vrun("unit", Result.FAIL, replica=1), vrun("lint",
                                                                                 Result.PASS)]
    for verifier, runs in (("lint", lint), ("unit", unit)):
        planned = nested_plan({verifier: Result.FLAKY}, runs, specs)
        assert [p.lens for p in planned] == ["clean_rerun", "clean_rerun", "instrumented"]


def test_inconclusive_gets_one_clean_rerun(specs: dict[str, VerifierSpec]) -> None:
    planned = nested_plan({"sec": Result.INCONCLUSIVE, "lint": Result.PASS},
                          [vrun("sec", Result.INCONCLUSIVE), vrun("lint", Result.PASS)], specs)
    assert lenses_of(planned) == [("sec", "clean_rerun", False)]


def test_the_independent_checker_is_added_only_until_it_has_run(
        specs: dict[str, VerifierSpec]) -> None:
    first = nested_plan({"unit": Result.INCONCLUSIVE}, [vrun("unit", Result.INCONCLUSIVE)],
                        specs)
    assert lenses_of(first) == [("unit", "clean_rerun", False), ("lint", "independent", False)]
    ran = [vrun("unit", Result.INCONCLUSIVE), vrun("lint", Result.PASS)]
    again = nested_plan({"unit": Result.INCONCLUSIVE}, ran, specs)
    assert lenses_of(again) == [("unit", "clean_rerun", False)]


def test_an_independent_checker_shared_by_two_verifiers_is_planned_once(
        specs: dict[str, VerifierSpec]) -> None:
    both = {**specs, "sec": specs["sec"].model_copy(
        update={"lenses": specs["unit"].lenses})}  # sec names lint as its checker too
    planned = nested_plan({"unit": Result.INCONCLUSIVE, "sec": Result.INCONCLUSIVE},
                          [vrun("unit", Result.INCONCLUSIVE), vrun("sec", Result.INCONCLUSIVE)],
                          both)
    assert [p.name for p in planned].count("lint") == 1


def test_nested_replicas_continue_after_existing_runs(specs: dict[str, VerifierSpec]) -> None:
    runs = [vrun("unit", Result.PASS), vrun("unit", Result.FAIL, replica=1, tests=("t::a",)),
            vrun("unit", Result.PASS, replica=4, lens="clean_rerun")]
    planned = nested_plan({"unit": Result.FLAKY}, runs, specs)
    keys = [(r.verifier, r.replica) for r in runs] + [(p.name, p.replica) for p in planned]
    assert len(keys) == len(set(keys))
    assert min(p.replica for p in planned if p.name == "unit") == 5


# -- split ---------------------------------------------------------------------------------

def verdicts_of(runs: list[VerifierRun]) -> dict[str, Result]:
    return {r.verifier: r.report.result for r in runs}


def test_a_part_splits_again_when_its_failure_divides(specs: dict[str, VerifierSpec]) -> None:
    part = item("wi~1").model_copy(update={"split_of": "wi"})
    runs = [vrun("unit", Result.FAIL), vrun("lint", Result.FAIL)]
    assert [p.id for p in split_parts(part, runs, verdicts_of(runs), specs, remaining=3)] == [
        "wi~1~1", "wi~1~2"]


def test_nothing_splits_when_the_budget_cannot_run_every_part(
        specs: dict[str, VerifierSpec]) -> None:
    runs = [vrun("unit", Result.FAIL), vrun("lint", Result.FAIL)]
    assert split_parts(item(), runs, verdicts_of(runs), specs, remaining=1) == []


@pytest.mark.parametrize("runs", [
    [vrun("lint", Result.FAIL, tests=("t::a", "t::b"))],
    [vrun("unit", Result.FAIL, tests=("t::a",)), vrun("lint", Result.PASS)],
], ids=["verifier-without-isolate", "one-failing-test"])
def test_a_single_failing_piece_does_not_split(specs: dict[str, VerifierSpec],
                                               runs: list[VerifierRun]) -> None:
    assert split_parts(item(), runs, verdicts_of(runs), specs, remaining=3) == []


def test_two_failing_verifiers_make_two_parts(specs: dict[str, VerifierSpec]) -> None:
    runs = [vrun("unit", Result.FAIL), vrun("lint", Result.FAIL), vrun("sec", Result.PASS)]
    parts = split_parts(item(), runs, verdicts_of(runs), specs, remaining=3)
    assert [(p.id, p.required_verifiers, p.split_of) for p in parts] == [
        ("wi~1", ("lint",), "wi"), ("wi~2", ("unit",), "wi")]


def test_flaky_counts_as_a_failing_piece(specs: dict[str, VerifierSpec]) -> None:
    runs = [vrun("unit", Result.FAIL), vrun("lint", Result.PASS)]
    verdicts = {"unit": Result.FAIL, "lint": Result.FLAKY}
    assert len(split_parts(item(), runs, verdicts, specs, remaining=3)) == 2


def test_a_verifier_that_isolates_splits_per_failing_test(
        specs: dict[str, VerifierSpec]) -> None:
    runs = [vrun("unit", Result.FAIL, tests=("t::a", "t::b", "t::c"))]
    parts = split_parts(item(), runs, verdicts_of(runs), specs, remaining=3)
    assert [(p.required_verifiers, p.focus) for p in parts] == [
        (("unit",), ("t::a",)), (("unit",), ("t::b",)), (("unit",), ("t::c",))]


def test_too_many_pieces_split_per_verifier(specs: dict[str, VerifierSpec]) -> None:
    tests = tuple(f"t::{n}" for n in range(MAX_PARTS + 1))
    runs = [vrun("unit", Result.FAIL, tests=tests), vrun("lint", Result.FAIL)]
    parts = split_parts(item(), runs, verdicts_of(runs), specs, remaining=3)
    assert [(p.required_verifiers, p.focus) for p in parts] == [(("lint",), ()),
                                                                (("unit",), tests)]


@pytest.mark.parametrize("parent", ["wi", "w" * 128])
def test_part_ids_are_valid_work_item_ids(specs: dict[str, VerifierSpec], parent: str) -> None:
    runs = [vrun("unit", Result.FAIL), vrun("lint", Result.FAIL)]
    parts = split_parts(item(parent), runs, verdicts_of(runs), specs, remaining=3)
    for k, part in enumerate(parts, start=1):
        assert part.id.endswith(f"~{k}")
        assert WorkItem.model_validate(part.model_dump()) == part
    assert len({p.id for p in parts}) == len(parts)


def test_part_feedback_keeps_only_the_parts_verifier() -> None:
    part = item("wi~1").model_copy(update={"split_of": "wi", "required_verifiers": ("lint",)})
    reports = [report("unit", Result.FAIL), report("lint", Result.FAIL),
               report("sec", Result.PASS)]
    assert [r.verifier for r in part_feedback(part, reports)] == ["lint"]


def test_a_focused_parts_feedback_keeps_only_its_tests() -> None:
    part = item("wi.2").model_copy(update={"split_of": "wi", "focus": ("t::b",)})
    reports = [report("unit", Result.FAIL, tests=("t::a", "t::b", "t::c"))]
    [mine] = part_feedback(part, reports)
    assert [s.test_id for s in mine.failure_signatures] == ["t::b"]


def test_a_focused_parts_feedback_suggests_nothing_about_the_other_parts_tests() -> None:
    """A part runs on its own (in a plan, beside the others): the next actions that name
    another part's failing test are not its to take."""
    part = item("wi.2").model_copy(update={"split_of": "wi", "focus": ("t::b",)})
    failing = report("unit", Result.FAIL, tests=("t::a", "t::b")).model_copy(update={
        "next_actions": ("Fix t::a: assert 1 == 2", "Fix t::b: assert 3 == 4",
                         "Run the suite")})
    [mine] = part_feedback(part, [failing])
    assert mine.next_actions == ("Fix t::b: assert 3 == 4", "Run the suite")


def test_parts_never_get_more_than_what_is_left_of_the_budget(
        specs: dict[str, VerifierSpec]) -> None:
    """Old behaviour: each part got max(2, ceil(left / parts)): at 3 of 3, two parts got two
    attempts each. Now each part may use at most what is left; the run's shared count of
    executor runs stops them all at the parent's ceiling."""
    runs = [vrun("unit", Result.FAIL), vrun("lint", Result.FAIL)]
    wide = item().model_copy(update={"max_attempts": 10})
    assert [p.max_attempts for p in split_parts(wide, runs, verdicts_of(runs), specs,
                                                remaining=7)] == [7, 7]
    assert [p.max_attempts for p in split_parts(wide, runs, verdicts_of(runs), specs,
                                                remaining=2)] == [2, 2]


def test_test_ids_that_look_like_options_never_reach_the_isolate_command(
        specs: dict[str, VerifierSpec]) -> None:
    from choir.director.lenses import failing_tests

    # "@args.txt": a file of options pytest reads first (review 17b: "--co" in it, exit 0)
    runs = [vrun("unit", Result.FAIL, tests=("--version", "@args.txt", "t.py::ok", "bad\x1b[0m"))]
    assert failing_tests(runs, "unit") == ("t.py::ok",)
