"""Escalate is an action: a stronger executor for the attempts left, or a person through the
approval interrupt with the evidence attached; on the old code it was a halt with a sentence."""

from __future__ import annotations

from pathlib import Path

from choir.models import ExecutorSpec, WorkItem
from choir.models.run import VerifierRun
from tests.unit.governance.loop import drive, fail, setup


def lint_keeps_failing(item: WorkItem, _round: int) -> list[VerifierRun]:
    return [fail("lint")]


def test_a_failure_that_does_not_divide_goes_to_the_stronger_executor(tmp_path: Path) -> None:
    stronger = ExecutorSpec(kind="llm", model="stronger-model")
    config, policy, item = setup(tmp_path, max_attempts=6, required_verifiers=("lint",),
                                 escalate_to=stronger)
    state, executed = drive(config, policy, item, lint_keeps_failing)
    assert len(executed) == 6  # the stronger executor draws on the same budget
    runs = [e for e in state["events"] if e.startswith("execute ")]
    assert [r.endswith("(executor command)") for r in runs] == [True] * 3 + [False] * 3
    assert all(r.endswith("(executor llm)") for r in runs[3:])
    assert "escalated wi to executor llm (model stronger-model)" in state["events"]
    escalated = next(e for e in state["events"] if ": escalate (" in e)
    assert "does not divide further" in escalated and "for the 3 attempt(s) left" in escalated
    assert state["status"] == "halted" and "budget spent (6/6)" in state["reason"]


def test_a_person_gets_it_through_the_approval_interrupt_with_the_evidence(
        tmp_path: Path) -> None:
    config, policy, item = setup(tmp_path, max_attempts=5, required_verifiers=("lint",),
                                 escalate_to="human")
    state, executed = drive(config, policy, item, lint_keeps_failing)
    assert len(executed) == 3
    assert state["status"] == "awaiting_approval"
    escalation = state["escalation"]
    assert escalation["work_item"] == "wi" and "does not divide" in escalation["reason"]
    assert escalation["evidence"] == ["lint: FAIL: what happened"]
    assert any(e.startswith("escalated wi to a person") for e in state["events"])


def test_the_policys_human_escalation_applies_when_the_item_names_nobody(
        tmp_path: Path) -> None:
    config, policy, item = setup(tmp_path, max_attempts=2, required_verifiers=("lint",))
    policy = policy.model_copy(update={"escalate_to": "human"})
    state, _ = drive(config, policy, item, lint_keeps_failing)
    assert state["status"] == "awaiting_approval"
    assert "attempt budget spent (2/2)" in state["escalation"]["reason"]
