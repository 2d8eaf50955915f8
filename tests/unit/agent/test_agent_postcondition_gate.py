"""A failed tool postcondition blocks completion until that tool's effect checks out.

Review 11, F3: a model that sent ``[set_flag(...), final_output(...)]`` in one reply got
``status="completed"`` with the postcondition failed, and the rejection was never read by
any model turn; a ``final_output`` on the next turn completed too. Both are attacks on the
documented rule (docs/postconditions.md): success means verified after an action.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from choir import Agent
from choir.agent.store import SqliteContextStore
from choir.testing import FakeModel, final_output, reply, tool_call
from tests.postcondition_systems import flag_db
from tests.unit.postconditions.test_agent_postconditions import _check, _flag_tool

SET = {"name": "beta", "value": "on"}


def _tool_replies(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in messages if m.get("role") == "tool"]


def test_final_output_in_the_same_reply_as_a_failed_postcondition_is_not_considered(
        tmp_path: Path) -> None:
    db = flag_db(tmp_path / "system", {"beta": "off"})
    verified: list[Any] = []
    model = FakeModel([reply(tool_call("set_flag", SET), tool_call("final_output",
                                                                  {"output": "done"})),
                       reply(tool_call("set_flag", SET)),
                       final_output(output="beta is on")])
    agent = Agent(model=model, tools=[_flag_tool(db, lose_first=1)],
                  verifier=lambda out: verified.append(out) or out,
                  postconditions={"set_flag": [_check(db)]})
    result = agent.run_sync("turn beta on")
    # the first reply did not finish the run: the model was asked again and read both answers
    assert len(model.requests) == 3
    seen = _tool_replies(model.requests[1])
    assert '<verification_rejected code="postcondition_fail">' in seen[0]
    assert "- before_final_output: call set_flag again until its postconditions pass" in seen[0]
    assert seen[1].startswith("Not considered: a postcondition of an earlier call in this "
                              "reply failed (set_flag)")
    assert verified == ["beta is on"]  # the refused final_output never reached the verifier
    assert result.status == "completed" and result.output == "beta is on"
    assert result.context.verification.attempts_used == 1  # the postcondition's rejection
    assert result.context.verification.unresolved == {}
    assert "final_output_refused" in result.events


def test_final_output_on_a_later_turn_waits_for_the_tool_to_pass(tmp_path: Path) -> None:
    db = flag_db(tmp_path / "system", {"beta": "off"})
    model = FakeModel([reply(tool_call("set_flag", SET)),
                       final_output(output="done anyway"),
                       reply(tool_call("set_flag", SET)),
                       final_output(output="beta is on")])
    agent = Agent(model=model, tools=[_flag_tool(db, lose_first=1)],
                  postconditions={"set_flag": [_check(db)]})
    result = agent.run_sync("turn beta on")
    assert len(model.requests) == 4
    refused = _tool_replies(model.requests[2])[-1]
    assert refused.startswith("Not considered: a postcondition of set_flag failed")
    assert "call set_flag again" in refused
    assert result.status == "completed" and result.output == "beta is on"
    assert result.context.invalid_responses == 1  # told once, it finished anyway


def test_a_model_that_never_fixes_the_effect_cannot_complete(tmp_path: Path) -> None:
    db = flag_db(tmp_path / "system", {"beta": "off"})
    model = FakeModel([reply(tool_call("set_flag", SET))]
                      + [final_output(output="done") for _ in range(5)])
    agent = Agent(model=model, tools=[_flag_tool(db, lose_first=9)],
                  postconditions={"set_flag": [_check(db)]}, max_invalid_responses=2)
    result = agent.run_sync("turn beta on")
    assert result.status == "failed" and result.error == "invalid_responses"
    assert "run_completed" not in result.events


def test_the_unresolved_mark_survives_a_resume(tmp_path: Path) -> None:
    db = flag_db(tmp_path / "system", {"beta": "off"})
    store = SqliteContextStore(tmp_path / "agents.sqlite")
    first = Agent(model=FakeModel([reply(tool_call("set_flag", SET))]),
                  tools=[_flag_tool(db, lose_first=1)],
                  postconditions={"set_flag": [_check(db)]})
    stopped = first.run_sync("turn beta on", run_id="r1", store=store)
    assert stopped.status == "failed"  # the script ran out after the rejected call
    saved = store.load("r1")
    assert saved is not None and set(saved.verification.unresolved) == {"set_flag"}
