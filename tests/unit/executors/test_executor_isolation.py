"""How an executor's isolation is chosen, passed on and recorded (issue #10 item 6)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from choir._core.canonical import canonical_json
from choir.executors import _passed_env, executor_isolation, masked_paths
from choir.models import AttestationBody, Environment, Result, Target
from choir.models.workitem import ExecutorSpec


def _body(**extra: object) -> AttestationBody:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return AttestationBody(
        run_id="r", verifier="unit", verifier_kind="unit_tests", verifier_version="v",
        verifier_config_hash="0" * 64, commands=("pytest",),
        target=Target(work_item="w", tree_hash="7" * 64), result=Result.PASS,
        report_hash="1" * 64, manifest_hash="2" * 64,
        environment=Environment(sandbox="bwrap", isolation="namespace"),
        started_at=now, ended_at=now, **extra)  # type: ignore[arg-type]


def test_a_body_without_an_executor_keeps_the_bytes_it_was_signed_with() -> None:
    """Attestations minted before the field existed (and `choir verify`'s) keep their ids."""
    plain = canonical_json(_body())
    assert b"executor_isolation" not in plain
    assert AttestationBody.model_validate_json(plain) == _body()
    recorded = canonical_json(_body(executor_isolation="none"))
    assert b'"executor_isolation":"none"' in recorded
    assert AttestationBody.model_validate_json(recorded).executor_isolation == "none"


def test_trust_mode_is_none_and_llm_is_tools() -> None:
    assert executor_isolation(ExecutorSpec(kind="command", command="x", sandbox="none")) == "none"
    assert executor_isolation(ExecutorSpec(kind="llm")) == "tools"


def test_the_executor_gets_none_of_choirs_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOIR_SIGNING_HINT", "x")
    monkeypatch.setenv("AGENT_ARTIFACT_DIR", "/somewhere")
    monkeypatch.setenv("MY_TOOL_TOKEN", "kept")
    env = _passed_env()
    assert not [k for k in env if k.startswith("CHOIR_")]
    assert "AGENT_ARTIFACT_DIR" not in env and "HOME" not in env
    assert env["MY_TOOL_TOKEN"] == "kept"


def test_choirs_home_and_store_are_masked(choir_home: Path) -> None:
    (choir_home / "artifacts").mkdir()
    hidden = masked_paths()
    assert choir_home.resolve() in hidden and (choir_home / "artifacts").resolve() in hidden
