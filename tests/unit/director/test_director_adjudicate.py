"""The Director: plans stay inside the allowlist, and the evidence of a round decides the loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.config import RepoConfig, load_repo_config
from choir.config.policy import Policy, load_policy
from choir.director import Decision, adjudicate, part_plan, plan, verdicts
from choir.models import (
    Counts,
    FailureSignature,
    Mood,
    Result,
    Target,
    VerificationReport,
    VerifierPlan,
    WorkItem,
)
from choir.models.run import VerifierRun

CHOIR_YAML = """\
verifiers:
  unit:
    kind: unit_tests
    steps: [{name: setup, command: "true"}, {name: test, command: "pytest -q"}]
    lenses: {isolate: "pytest -q {tests}", independent: lint}
  lint: {kind: lint, steps: [{name: t, command: "true"}]}
  sec: {kind: security_scan, steps: [{name: t, command: "true"}]}
"""
ALLOWLIST = frozenset({"unit", "lint", "sec"})


def repo_config(path: Path, text: str = CHOIR_YAML) -> RepoConfig:
    path.mkdir(parents=True, exist_ok=True)
    (path / "choir.yaml").write_text(text)
    return load_repo_config(path)


def report(verifier: str, result: Result, *, tests: tuple[str, ...] = (),
           summary: str = "what happened", excerpt: str = "") -> VerificationReport:
    signatures = tuple(FailureSignature(id=f"{verifier}:{t}", kind="assertion", test_id=t,
                                        excerpt=excerpt) for t in tests)
    return VerificationReport(verifier=verifier, verifier_type="unit_tests",
                              target=Target(tree_hash="0" * 64), result=result,
                              summary=summary, next_actions=("look",), confidence=0.9,
                              counts=Counts(), failure_signatures=signatures)


def vrun(verifier: str, result: Result, *, replica: int = 0, diagnostic: bool = False,
         tests: tuple[str, ...] = (), lens: str = "default", infra: bool = False) -> VerifierRun:
    return VerifierRun(verifier=verifier, run_id=f"{verifier}-{replica}", lens=lens,
                       replica=replica, diagnostic=diagnostic,
                       report=report(verifier, result, tests=tests),
                       report_hash="0" * 64, manifest_hash="0" * 64, infra=infra)


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    return load_policy(repo_config(tmp_path / "repo"))


def decide(runs: list[VerifierRun], policy: Policy, *, mood: Mood = Mood.CALM,
           attempt: int = 1, max_attempts: int = 5, history: list[list[str]] | None = None,
           nested_done: int = 0, can_split: bool = False,
           broaden: tuple[str, ...] = ()) -> Decision:
    return adjudicate(runs, policy=policy, mood=mood, attempt=attempt,
                      max_attempts=max_attempts, history=history or [],
                      nested_done=nested_done, can_split=can_split, broaden=broaden)


FAIL_SIG = ["unit:t::a"]


def failing() -> list[VerifierRun]:
    return [vrun("unit", Result.FAIL, tests=("t::a",))]


# -- verdicts ------------------------------------------------------------------------------

@pytest.mark.parametrize("conclusive", [Result.PASS, Result.FAIL])
def test_an_infra_inconclusive_run_is_ignored_once_a_conclusive_run_exists(
        conclusive: Result) -> None:
    runs = [vrun("unit", Result.INCONCLUSIVE, infra=True), vrun("unit", conclusive, replica=1)]
    assert verdicts(runs) == {"unit": conclusive}


@pytest.mark.parametrize(("conclusive", "verdict"), [(Result.PASS, Result.FLAKY),
                                                     (Result.FAIL, Result.FAIL)])
def test_an_inconclusive_the_step_made_beside_a_pass_is_flaky(conclusive: Result,
                                                               verdict: Result) -> None:
    """Review 17b (critical): a failing run dressed as a tool's crash (``os._exit(4)`` at
    exit, a plugin exiting 4 on the first failing report, "No module named pytest" printed)
    was INCONCLUSIVE, ignored once the clean rerun passed: one passing run of two ASSERTed
    intermittently wrong code. Only the sandbox's or Choir's own failure is no say at all."""
    runs = [vrun("unit", Result.INCONCLUSIVE), vrun("unit", conclusive, replica=1)]
    assert verdicts(runs) == {"unit": verdict}


def test_pass_and_fail_for_one_verifier_is_flaky() -> None:
    runs = [vrun("unit", Result.PASS), vrun("unit", Result.FAIL, replica=1),
            vrun("lint", Result.PASS)]
    assert verdicts(runs) == {"unit": Result.FLAKY, "lint": Result.PASS}


def test_only_inconclusive_runs_stay_inconclusive() -> None:
    runs = [vrun("unit", Result.INCONCLUSIVE), vrun("unit", Result.INCONCLUSIVE, replica=1)]
    assert verdicts(runs) == {"unit": Result.INCONCLUSIVE}


def test_diagnostic_runs_never_vote() -> None:
    runs = [vrun("unit", Result.PASS),
            vrun("unit", Result.FAIL, replica=1, diagnostic=True, lens="instrumented"),
            vrun("lint", Result.FAIL, diagnostic=True, lens="instrumented")]
    assert verdicts(runs) == {"unit": Result.PASS}


# -- adjudicate ----------------------------------------------------------------------------

def test_all_pass_is_done(policy: Policy) -> None:
    runs = [vrun("unit", Result.PASS), vrun("lint", Result.PASS)]
    assert decide(runs, policy).action == "done"


def test_all_pass_with_coverage_still_owed_broadens(policy: Policy) -> None:
    decision = decide([vrun("unit", Result.PASS)], policy, mood=Mood.BOLD, broaden=("sec",))
    assert decision.action == "broaden" and "sec" in decision.reason
    assert decision.mood is Mood.BOLD


def test_no_voting_run_is_never_done(policy: Policy) -> None:
    diagnostic_only = [vrun("unit", Result.PASS, diagnostic=True, lens="instrumented")]
    assert decide(diagnostic_only, policy).action != "done"
    assert decide([], policy, nested_done=policy.nested_max).action != "done"


def test_a_failure_retries_with_a_hypothesis_for_the_executor(policy: Policy) -> None:
    decision = decide(failing() + [vrun("lint", Result.PASS)], policy)
    assert decision.action == "retry" and decision.mood is Mood.CALM
    assert "hypothesis sent to the executor" in decision.reason


@pytest.mark.parametrize(("mood", "switched"), [(Mood.CALM, Mood.CURIOUS),
                                                (Mood.CURIOUS, Mood.SKEPTICAL)])
def test_the_same_failure_again_switches_mood(policy: Policy, mood: Mood,
                                              switched: Mood) -> None:
    history = [FAIL_SIG] * (policy.same_signature_limit - 1)
    decision = decide(failing(), policy, mood=mood, history=history)
    assert decision.action == "retry" and decision.mood is switched


def test_a_different_failure_keeps_the_mood(policy: Policy) -> None:
    history = [["unit:t::other"]] * (policy.halt_after - 1)
    decision = decide(failing(), policy, history=history, can_split=True)
    assert decision.action == "retry" and decision.mood is Mood.CALM


@pytest.mark.parametrize(("mood", "after"), [(Mood.CALM, Mood.SKEPTICAL),
                                             (Mood.PARANOID, Mood.PARANOID)])
def test_the_same_failure_at_halt_after_splits_when_it_divides(policy: Policy, mood: Mood,
                                                               after: Mood) -> None:
    history = [FAIL_SIG] * (policy.halt_after - 1)
    decision = decide(failing(), policy, mood=mood, history=history, can_split=True)
    assert decision.action == "split" and decision.mood is after


def test_the_same_failure_at_halt_after_halts_when_it_does_not_divide(policy: Policy) -> None:
    history = [FAIL_SIG] * (policy.halt_after - 1)
    assert decide(failing(), policy, history=history).action == "halt"


def test_a_spent_attempt_budget_halts(policy: Policy) -> None:
    decision = decide(failing(), policy, attempt=3, max_attempts=3)
    assert decision.action == "halt" and "attempt budget" in decision.reason


@pytest.mark.parametrize("runs", [
    [vrun("unit", Result.PASS), vrun("unit", Result.FAIL, replica=1)],
    [vrun("unit", Result.INCONCLUSIVE), vrun("lint", Result.PASS)],
], ids=["flaky", "inconclusive"])
def test_unsettled_evidence_gets_a_nested_round(policy: Policy, runs: list[VerifierRun]) -> None:
    decision = decide(runs, policy, nested_done=policy.nested_max - 1)
    assert decision.action == "nested" and "unit" in decision.reason


def test_inconclusive_after_the_nested_budget_halts(policy: Policy) -> None:
    decision = decide([vrun("unit", Result.INCONCLUSIVE)], policy,
                      nested_done=policy.nested_max)
    assert decision.action == "halt" and "still inconclusive" in decision.reason


def test_flaky_after_the_nested_budget_is_a_failure(policy: Policy) -> None:
    runs = [vrun("unit", Result.PASS), vrun("unit", Result.FAIL, replica=1, tests=("t::a",))]
    retried = decide(runs, policy, nested_done=policy.nested_max)
    assert retried.action == "retry" and "flaky" in retried.reason
    spent = decide(runs, policy, nested_done=policy.nested_max, attempt=4, max_attempts=4)
    assert spent.action == "halt"


def test_a_failure_beside_flaky_evidence_is_not_sent_to_a_nested_round(policy: Policy) -> None:
    runs = [vrun("unit", Result.PASS), vrun("unit", Result.FAIL, replica=1),
            vrun("lint", Result.FAIL)]
    assert decide(runs, policy).action == "retry"


# -- plan ----------------------------------------------------------------------------------

def names(verifier_plan: VerifierPlan) -> list[str]:
    return list(dict.fromkeys(p.name for p in verifier_plan.verifiers))


def test_the_policy_plan_is_the_moods_verifiers(policy: Policy) -> None:
    calm = plan(policy, Mood.CALM, ALLOWLIST)
    assert names(calm) == ["unit"]
    assert calm.suggested_by == "policy" and calm.dropped == ()
    assert names(plan(policy, Mood.SKEPTICAL, ALLOWLIST)) == ["unit", "lint"]


def test_a_plan_never_leaves_the_allowlist(policy: Policy) -> None:
    narrowed = plan(policy, Mood.SKEPTICAL, {"unit"}, required=["ghost"])
    assert names(narrowed) == ["unit"]
    assert set(narrowed.dropped) == {"ghost", "lint"}


def test_a_suggestion_adds_only_allowlisted_names(policy: Policy) -> None:
    suggested = plan(policy, Mood.CALM, ALLOWLIST, suggestion=["sec", "curl evil.com", "unit"])
    assert names(suggested) == ["unit", "sec"]
    assert suggested.dropped == ("curl evil.com",)
    assert suggested.suggested_by == "model"


def test_a_suggestion_cannot_remove_a_policy_verifier(policy: Policy) -> None:
    for suggestion in ([], ["sec"]):
        assert {"unit", "lint"} <= set(names(plan(policy, Mood.SKEPTICAL, ALLOWLIST,
                                                  suggestion=suggestion)))


def test_without_a_suggestion_the_plan_is_the_policys(policy: Policy) -> None:
    assert plan(policy, Mood.CALM, ALLOWLIST, suggestion=None).suggested_by == "policy"


def test_paranoid_runs_each_verifier_twice_default_then_clean_rerun(policy: Policy) -> None:
    paranoid = plan(policy, Mood.PARANOID, ALLOWLIST)
    assert names(paranoid) == ["unit", "lint", "sec"]
    for name in names(paranoid):
        runs = [(p.lens, p.replica) for p in paranoid.verifiers if p.name == name]
        assert runs == [("default", 0), ("clean_rerun", 1)]


# -- part_plan -----------------------------------------------------------------------------

def part(required: tuple[str, ...], focus: tuple[str, ...] = ()) -> WorkItem:
    return WorkItem(id="wi.1", goal="g", repo=".", required_verifiers=required,
                    split_of="wi", focus=focus)


def test_a_part_plans_only_its_own_verifiers(tmp_path: Path, policy: Policy) -> None:
    specs = repo_config(tmp_path / "repo").verifiers
    planned = part_plan(part(("lint",)), policy, Mood.SKEPTICAL, specs)
    assert [(p.name, p.lens, p.tests) for p in planned.verifiers] == [("lint", "default", ())]


def test_a_focused_part_isolates_its_tests(tmp_path: Path, policy: Policy) -> None:
    specs = repo_config(tmp_path / "repo").verifiers
    focus = ("t::a", "t::b")
    planned = part_plan(part(("unit",), focus), policy, Mood.PARANOID, specs)
    assert [p.replica for p in planned.verifiers] == [0, 1]
    assert all(p.name == "unit" and p.lens == "isolated_subset" and p.tests == focus
               for p in planned.verifiers)


def test_a_focused_part_without_isolate_runs_the_whole_verifier(tmp_path: Path,
                                                                policy: Policy) -> None:
    specs = repo_config(tmp_path / "repo").verifiers
    planned = part_plan(part(("lint",), ("t::a",)), policy, Mood.PARANOID, specs)
    assert [(p.lens, p.tests) for p in planned.verifiers] == [("default", ()),
                                                             ("clean_rerun", ())]


# -- review fixes: strictness never drops, evidence never thins ----------------------------

def test_paranoid_is_never_left_by_a_mood_switch(policy: Policy) -> None:
    from choir.director import next_mood

    assert next_mood(Mood.PARANOID) is Mood.PARANOID
    assert [next_mood(m) for m in (Mood.CALM, Mood.BOLD, Mood.CURIOUS, Mood.SKEPTICAL)] == [
        Mood.CURIOUS, Mood.CURIOUS, Mood.SKEPTICAL, Mood.SKEPTICAL]
    runs = [vrun("unit", Result.FAIL, tests=("t::a",), replica=r) for r in (0, 1)]
    decision = decide(runs, policy, mood=Mood.PARANOID, history=[FAIL_SIG])
    assert decision.action == "retry" and decision.mood is Mood.PARANOID


def test_an_inconclusive_replica_does_not_lower_paranoids_bar(policy: Policy,
                                                              tmp_path: Path) -> None:
    runs = [vrun("unit", Result.PASS), vrun("unit", Result.INCONCLUSIVE, replica=1, infra=True)]
    assert verdicts(runs, need=2) == {"unit": Result.INCONCLUSIVE}
    assert verdicts(runs, need=1) == {"unit": Result.PASS}
    assert decide(runs, policy, mood=Mood.PARANOID).action == "nested"
    from choir.director.lenses import nested_plan

    specs = repo_config(tmp_path / "other").verifiers
    planned = nested_plan({"unit": Result.INCONCLUSIVE}, runs, specs, need=3)
    assert [(p.lens, p.replica) for p in planned if p.name == "unit"] == [
        ("clean_rerun", 2), ("clean_rerun", 3)]  # one conclusive run; two more are owed


def test_a_pass_after_an_attested_fail_on_the_same_tree_is_flaky_and_not_nested(
        policy: Policy) -> None:
    passing = [vrun("unit", Result.PASS)]
    decision = adjudicate(passing, policy=policy, mood=Mood.CALM, attempt=1, max_attempts=4,
                          history=[], nested_done=0, contradicted={"unit"})
    assert decision.action == "retry"
    assert "unit failed on this same tree before" in decision.reason


def test_an_empty_round_halts_at_once(policy: Policy) -> None:
    decision = decide([], policy)
    assert decision.action == "halt" and "nothing was verified" in decision.reason



def test_a_view_of_the_base_checks_and_one_beside_the_additions_are_judged_apart() -> None:
    """Review 17h (the first tests of a repo): the base's checks ran no test (INCONCLUSIVE,
    made by the step) and the added tests passed beside them: judged as one list, that read
    as a disagreement, FLAKY ("fix your flaky test"); it is the twin rule's INCONCLUSIVE."""
    from choir.evidence.spec import ADDITIONS_REPLICA

    alone = vrun("unit", Result.INCONCLUSIVE)
    beside = vrun("unit", Result.PASS, replica=ADDITIONS_REPLICA)
    assert verdicts([alone, beside]) == {"unit": Result.INCONCLUSIVE}
    failing = vrun("unit", Result.FAIL)
    assert verdicts([failing, beside]) == {"unit": Result.FAIL}
    passing = vrun("unit", Result.PASS)
    assert verdicts([passing, beside]) == {"unit": Result.PASS}
