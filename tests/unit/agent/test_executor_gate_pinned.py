"""Issue #11 item 13: the llm executor's own gate verifies with the run's pinned configuration
and current mood, and every check it runs is attested (so ``choir audit`` accounts for it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from choir.agent.executor import ChangeSummary, green_verifier
from choir.attest import AttestationStore
from choir.audit import audit
from choir.config import load_repo_config
from choir.config.policy import load_policy
from choir.exceptions import VerificationRejected
from choir.executors.pinned import pinned_gate
from choir.models import Mood, WorkItem
from tests.workitems import calc_repo


def test_a_rewritten_choir_yaml_does_not_weaken_the_agents_gate(
        tmp_path: Path, choir_home: Path) -> None:
    repo = calc_repo(tmp_path / "repo", canary="c", sandbox="local")
    config = load_repo_config(repo)  # pinned when the run started: unit runs pytest
    (repo / "choir.yaml").write_text(  # the agent's edit: a gate that always passes
        "verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n"
        "      - {name: pytest, command: 'true'}\nsandbox: {backend: local}\n")
    item = WorkItem(id="wi", goal="g", repo=str(repo))
    with pinned_gate(config, load_policy(config), Mood.CURIOUS):
        verify = green_verifier(item, "run1-exec1")
    with pytest.raises(VerificationRejected):
        asyncio.run(verify(ChangeSummary(summary="fixed")))
    store = AttestationStore()
    (att,) = [store.get(i) for i in store.ids()]
    assert att.body.lens == "executor_gate" and att.body.mood == "CURIOUS"
    assert att.body.result.value == "FAIL" and att.body.commands[0].endswith(
        "--junitxml=$CHOIR_OUT/junit.xml")
    result = audit()
    assert result.ok, result.violations
