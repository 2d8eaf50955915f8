"""Drift: which runs raise it, with which severity, and what a decision's policy does."""

from __future__ import annotations

import pytest

from choir.director import Decision as Move
from choir.models import Counts, FailureSignature, Mood, Result, Target, VerificationReport
from choir.models.run import VerifierRun
from choir.postconditions.decisions import Decision
from choir.postconditions.drift import apply_policy, drift_events


def _run(name: str, result: Result, kind: str = "postcondition") -> VerifierRun:
    sig = () if result is Result.PASS else (FailureSignature(
        id="x", kind=f"postcondition_{result.value.lower()}", excerpt=f"{name} said no"),)
    report = VerificationReport(
        verifier=name, verifier_type=kind, result=result, summary="s", confidence=0.5,
        target=Target(tree_hash="t" * 64), failure_signatures=sig, counts=Counts(),
        next_actions=("a",))
    return VerifierRun(verifier=name, run_id=f"r-{name}", report=report, report_hash="h",
                       manifest_hash="m")


def test_fail_is_yellow_inconclusive_red_and_tree_verifiers_raise_none() -> None:
    events = drift_events([_run("a", Result.FAIL), _run("b", Result.INCONCLUSIVE),
                           _run("c", Result.PASS), _run("d", Result.FAIL, "unit_tests")],
                          {"r-a": "att-a"})
    assert [(e.verifier, e.severity, e.attestation) for e in events] == [
        ("a", "yellow", "att-a"), ("b", "red", None)]
    assert events[0].line() == "drift verify yellow: a: a said no"


@pytest.mark.parametrize(("policy", "action", "mood"), [
    ("continue", "retry", Mood.CALM), ("halt", "halt", Mood.CALM),
    ("degrade", "retry", Mood.SKEPTICAL)])
def test_red_drift_policy(policy: str, action: str, mood: Mood) -> None:
    rule = Decision.model_validate({"verification": {"methods": ["b"],
                                                     "on_red_drift": policy}})
    red = drift_events([_run("b", Result.INCONCLUSIVE)])
    yellow = drift_events([_run("a", Result.FAIL)])
    move = Move(action="retry", mood=Mood.CALM, reason="verification failed")
    after = apply_policy(move, red, rule)
    assert (after.action, after.mood) == (action, mood)
    assert apply_policy(move, yellow, rule) == move  # only red drift triggers the policy


@pytest.mark.parametrize(("mood", "degrade_to", "after"), [
    (Mood.PARANOID, "SKEPTICAL", Mood.PARANOID), (Mood.PARANOID, "CURIOUS", Mood.PARANOID),
    (Mood.SKEPTICAL, "CURIOUS", Mood.SKEPTICAL), (Mood.BOLD, "CURIOUS", Mood.CURIOUS),
    (Mood.SKEPTICAL, "PARANOID", Mood.PARANOID)])
def test_a_degrade_only_ever_climbs(mood: Mood, degrade_to: str, after: Mood) -> None:
    """Review 17b (F3): ``on_red_drift: degrade`` (default ``degrade_to: SKEPTICAL``) took a
    PARANOID run down to SKEPTICAL, one run each, unsafe isolation allowed, a stat-cached
    tree: an executor whose action makes a postcondition hang chose the weaker mood."""
    rule = Decision.model_validate({"verification": {"methods": ["b"], "on_red_drift": "degrade",
                                                     "degrade_to": degrade_to}})
    red = drift_events([_run("b", Result.INCONCLUSIVE)])
    move = Move(action="nested", mood=mood, reason="inconclusive: b")
    assert apply_policy(move, red, rule).mood is after


def test_a_crashed_postcondition_is_red_drift() -> None:
    """Review 17a: a postcondition's green thread that crashed (its resource's folder
    removed by the action: every run crashed at its bind) has a report of kind ``crashed``,
    which raised no drift, so ``on_red_drift: halt`` never applied."""
    crashed = _run("pc", Result.INCONCLUSIVE, kind="crashed")
    assert drift_events([crashed]) == []  # a verifier of another kind that crashed
    [event] = drift_events([crashed], postconditions={"pc"})
    assert (event.verifier, event.severity) == ("pc", "red")
