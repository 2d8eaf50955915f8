"""choir.Agent tool postconditions against a real SQLite file: a lost write goes back to the
model as the seed-000 rejection block and counts one attempt; a hung check is a rejection
too; running out of attempts fails the run."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from choir import Agent
from choir.postconditions.agent import Postcondition
from choir.postconditions.spec import Resource
from choir.testing import FakeModel, final_output, reply, tool_call
from tests.postcondition_systems import flag_db


def _flag_tool(db: Path, lose_first: int) -> Any:
    calls = {"n": 0}

    def set_flag(name: str, value: str) -> str:
        """Set a feature flag.

        Args:
            name: the flag.
            value: on or off.
        """
        calls["n"] += 1
        con = sqlite3.connect(db)
        written = "off" if calls["n"] <= lose_first else value  # a write lost on the way
        con.execute("UPDATE flags SET value = ? WHERE name = ?", (written, name))
        con.commit()
        con.close()
        return f"flag {name} set"

    return set_flag


def _check(db: Path, **extra: Any) -> Postcondition:
    return Postcondition(
        name="flag_visible", resources={"flags": Resource(sqlite=str(db))},
        read_after_write={"resource": "flags", "expect_from": "value",
                          "sql": "SELECT value FROM flags WHERE name = :name",
                          "verify_timeout_ms": 300}, **extra)


def _script() -> list[Any]:
    call = tool_call("set_flag", {"name": "beta", "value": "on"})
    return [reply(call), reply(tool_call("set_flag", {"name": "beta", "value": "on"})),
            final_output(output="beta is on")]


def test_lost_write_is_rejected_then_fixed(tmp_path: Path) -> None:
    db = flag_db(tmp_path / "system", {"beta": "off"})
    model = FakeModel(_script())
    agent = Agent(model=model, tools=[_flag_tool(db, lose_first=1)],
                  postconditions={"set_flag": [_check(db)]}, verifier_max_attempts=3)
    result = agent.run_sync("turn beta on")
    assert result.status == "completed" and result.output == "beta is on"
    assert result.events.count("verification_rejected") == 1
    assert "postcondition_fail" in result.events and "postcondition_pass" in result.events
    assert result.context.verification.attempts_used == 1
    seen = [m["content"] for m in model.requests[1] if m.get("role") == "tool"][-1]
    assert '<verification_rejected code="postcondition_fail">' in seen
    assert "read back 'off', expected 'on'" in seen
    drift = [e for e in result.event_log if e.name == "drift"]
    assert drift and drift[0].data["severity"] == "yellow"


def test_out_of_attempts_fails_the_run(tmp_path: Path) -> None:
    db = flag_db(tmp_path / "system", {"beta": "off"})
    agent = Agent(model=FakeModel(_script()), tools=[_flag_tool(db, lose_first=5)],
                  postconditions={"set_flag": [_check(db)]}, verifier_max_attempts=1)
    result = agent.run_sync("turn beta on")
    assert result.status == "failed" and result.error == "verification_exhausted"


def test_a_hung_check_is_inconclusive_and_rejected(tmp_path: Path) -> None:
    db = flag_db(tmp_path / "system", {"beta": "off"})
    (tmp_path / "hang.py").write_text("import time\ndef verify(c):\n    time.sleep(30)\n")
    hang = Postcondition(name="hangs", callable="hang.py", timeout_s=0.5, cwd=str(tmp_path))
    model = FakeModel(_script())
    agent = Agent(model=model, tools=[_flag_tool(db, lose_first=0)],
                  postconditions={"set_flag": [hang]}, verifier_max_attempts=3)
    result = agent.run_sync("turn beta on")
    assert "postcondition_inconclusive" in result.events
    seen = [m["content"] for m in model.requests[1] if m.get("role") == "tool"][-1]
    assert 'code="postcondition_inconclusive"' in seen and "did not finish" in seen


def test_postconditions_must_name_a_tool(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tools: nope"):
        Agent(model=FakeModel([]), tools=[], postconditions={"nope": []})


def test_blast_radius_at_or_below_the_threshold_skips_the_check(tmp_path: Path) -> None:
    db = flag_db(tmp_path / "system", {"beta": "off"})
    for radius, checked in (("small", False), ("medium", True)):
        model = FakeModel([reply(tool_call("set_flag", {"name": "beta", "value": "on"})),
                           final_output(output="done")])
        check = _check(db, required_above_blast_radius="small")
        agent = Agent(model=model, tools=[_flag_tool(db, lose_first=1)],
                      postconditions={"set_flag": [check]})
        result = agent.run_sync("turn beta on", blast_radius=radius)
        assert ("postcondition_fail" in result.events) is checked


def test_an_invariant_callable_needs_no_resource_and_its_verdict_stands(tmp_path: Path) -> None:
    """Review 17a: an ``invariant_check`` naming a callable (it reads what it needs) raised
    KeyError('resource') from ``check()``, documented never to raise; and given a resource,
    a callable returning a failing verdict passed (truthiness). A resource named but not
    given is refused where the check is made."""
    (tmp_path / "inv.py").write_text(
        "def verify(c):\n    return {'outcome': 'fail', 'detail': 'account 7 is overdrawn'}\n")
    check = Postcondition(name="inv", invariant_check={"callable": "inv.py"}, cwd=str(tmp_path))
    result = check.check({"action": {}})
    assert (result.outcome, result.detail) == ("fail", "account 7 is overdrawn")
    with pytest.raises(ValueError, match="resource 'db' is not one of resources"):
        Postcondition(name="inv", invariant_check={"callable": "inv.py", "resource": "db"})
    with pytest.raises(ValueError, match="resource None is not one of resources"):
        Postcondition(name="raw", read_after_write={"sql": "SELECT 1", "expect_from": "v"})


def test_a_check_that_cannot_start_is_inconclusive(tmp_path: Path) -> None:
    """Review 17d: a tool called with a 200,000-character argument: the action reaches the
    harness in one environment variable, past the kernel's 128 KiB for one, and ``check``
    (documented never to raise) raised OSError E2BIG, crashing the Agent."""
    (tmp_path / "ok.py").write_text("def verify(c):\n    return True\n")
    check = Postcondition(name="ok", callable="ok.py", cwd=str(tmp_path))
    result = check.check({"action": {"tool": "write", "text": "x" * 200_000}})
    assert result.outcome == "inconclusive" and "could not start" in result.detail
    assert check.check({"action": {"tool": "write", "text": "x" * 1000}}).outcome == "pass"
