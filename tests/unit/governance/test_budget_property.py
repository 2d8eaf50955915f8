"""No work item or its parts ever exceeds ``max_attempts`` executor runs, whatever the
verifiers say round after round (a property over random failure patterns, driving the real
adjudicate node: split, nested splits, mood switches, escalation to a stronger executor)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choir.director import RANK
from choir.models import ExecutorSpec, Mood, Result, WorkItem
from choir.models.run import VerifierRun
from tests.unit.director.test_director_adjudicate import vrun
from tests.unit.governance.loop import drive, fail, ok, setup

TESTS = ("t::a", "t::b", "t::c", "t::d")
OUTCOMES = ("pass", "fail", "fail", "fail", "flaky", "inconclusive")


def random_script(data: st.DataObject):
    def script(item: WorkItem, _round: int) -> list[VerifierRun]:
        runs = []
        for name in item.required_verifiers:
            outcome = data.draw(st.sampled_from(OUTCOMES), label=f"{item.id} {name}")
            if outcome == "pass":
                runs.append(ok(name))
            elif outcome == "flaky":
                runs += [ok(name), fail(name, "t::a", replica=1)]
            elif outcome == "inconclusive":
                runs.append(vrun(name, Result.INCONCLUSIVE))
            elif name == "unit":
                pool = item.focus or TESTS
                tests = data.draw(st.lists(st.sampled_from(pool), min_size=1, unique=True),
                                  label="failing tests")
                runs.append(fail(name, *tests))
            else:
                runs.append(fail(name))
        return runs
    return script


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=st.data(), max_attempts=st.integers(1, 9),
       mood=st.sampled_from([Mood.CALM, Mood.BOLD, Mood.CURIOUS, Mood.SKEPTICAL]),
       stronger=st.booleans())
@pytest.mark.slow  # CI's slow stage: the README's command stays under five minutes
def test_no_work_item_or_its_parts_exceed_max_attempts(
        tmp_path: Path, data: st.DataObject, max_attempts: int, mood: Mood,
        stronger: bool) -> None:
    escalate = ExecutorSpec(kind="command", command="true") if stronger else None
    config, policy, item = setup(tmp_path, max_attempts=max_attempts, mood=mood,
                                 escalate_to=escalate)
    state, executed = drive(config, policy, item, random_script(data))
    assert len(executed) <= max_attempts, executed
    assert state["spent"] == len(executed)
    assert state["status"] in ("asserted", "halted"), state["status"]
    depths = [int(d) for e in state["events"] for d in re.findall(r"\(depth (\d+)/", e)]
    assert all(d <= policy.split_depth for d in depths)
    ranks = [RANK[Mood(m)] for m in state["moods"]]
    assert ranks == sorted(ranks), state["moods"]  # a mood left is never come back to
    assert state.get("switches", 0) <= policy.max_mood_switches


def test_a_split_at_the_last_attempt_never_runs_the_executor_again(tmp_path: Path) -> None:
    """On the old code, at attempt 3 of max_attempts 3, the same failure split into two
    parts with two attempts each: four more executor runs than the budget allowed."""
    config, policy, item = setup(tmp_path, max_attempts=3)

    def script(item: WorkItem, _round: int) -> list[VerifierRun]:
        return [fail(n, *(("t::a", "t::b") if n == "unit" else ())) for n in
                item.required_verifiers]

    state, executed = drive(config, policy, item, script)
    assert executed == ["wi", "wi", "wi"]
    assert state["status"] == "halted"
    assert "attempt budget spent (3/3)" in state["reason"]
    assert not any("split" in e for e in state["events"])


def test_parts_split_again_within_the_one_budget_down_to_the_depth_limit(
        tmp_path: Path) -> None:
    """On the old code a part never split again: wi~2 (two failing tests) halted the run."""
    config, policy, item = setup(tmp_path, max_attempts=12)
    fixed: set[str] = set()

    def script(item: WorkItem, _round: int) -> list[VerifierRun]:
        # lint and two unit tests fail; with at most two parts per split, the first split is
        # per verifier (lint | unit t::a t::b), and the unit part splits again per test; a
        # part that focuses on one test (or on lint) fixes it on its first attempt
        if item.split_of is not None and len(item.focus) <= 1:
            fixed.update(item.focus or ("lint",))
            return [ok(n) for n in item.required_verifiers]
        pool = [t for t in item.focus or ("t::a", "t::b") if t not in fixed]
        runs = [fail("unit", *pool) if pool else ok("unit")]
        if "lint" in item.required_verifiers:
            runs.append(ok("lint") if "lint" in fixed else fail("lint"))
        return runs

    from choir.director import split as split_module

    old = split_module.MAX_PARTS
    split_module.MAX_PARTS = 2
    try:
        state, executed = drive(config, policy, item, script)
    finally:
        split_module.MAX_PARTS = old
    assert state["status"] == "asserted", state["reason"]
    assert len(executed) <= 12 and state["spent"] == len(executed)
    splits = [e for e in state["events"] if e.startswith("split ")]
    assert splits[0].startswith("split wi into wi~1, wi~2 (depth 1/2")
    assert splits[1].startswith("split wi~2 into wi~2~1, wi~2~2 (depth 2/2"), splits
    assert executed == ["wi"] * 3 + ["wi~1"] + ["wi~2"] * 3 + ["wi~2~1", "wi~2~2"]


def test_nested_splits_stop_at_the_policys_depth(tmp_path: Path) -> None:
    config, policy, item = setup(tmp_path, max_attempts=40, required_verifiers=("unit", "lint"))
    policy = policy.model_copy(update={"split_depth": 1})

    def script(item: WorkItem, _round: int) -> list[VerifierRun]:
        return [fail("unit", *(item.focus or TESTS)), fail("lint")][
            :len(item.required_verifiers)] if item.split_of is None else \
            [fail(n, *item.focus) if n == "unit" else fail(n) for n in item.required_verifiers]

    state, executed = drive(config, policy, item, script)
    assert state["status"] == "halted"
    assert not any("depth 2/" in e for e in state["events"])
    assert len(executed) <= 40


@pytest.mark.parametrize("start", [Mood.CALM, Mood.BOLD, Mood.CURIOUS])
def test_the_same_failure_never_oscillates_between_moods(tmp_path: Path, start: Mood) -> None:
    """On the old code SKEPTICAL went back to CURIOUS on the same failure, and back again."""
    config, policy, item = setup(tmp_path, max_attempts=20, mood=start,
                                 required_verifiers=("lint",))
    policy = policy.model_copy(update={"halt_after": 99})
    state, _ = drive(config, policy, item, lambda item, _r: [fail("lint")])
    switches = [e for e in state["events"] if "; mood " in e]
    assert len(switches) <= policy.max_mood_switches
    assert state["moods"][-1] == Mood.SKEPTICAL.value
    ranks = [RANK[Mood(m)] for m in state["moods"]]
    assert ranks == sorted(ranks)
