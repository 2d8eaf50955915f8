"""The Agent through real litellm and HTTP: respx, and the loopback fake model server."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx
from pydantic import BaseModel

from choir import Agent
from choir.agent import RetryPolicy
from choir.exceptions import VerificationRejected
from choir.testing import FakeModelServer, final_output, reply, tool_call

URL = "https://api.openai.com/v1/chat/completions"
FAST = RetryPolicy(max_retries=2, backoff_s=0.0)


class Sum(BaseModel):
    value: int


def verify(output: Sum) -> int:
    if output.value != 5:
        raise VerificationRejected("the sum is wrong", code="wrong_sum",
                                   metadata={"expected_type": "int"})
    return output.value


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first addend.
        b: second addend.
    """
    return a + b


def tool_reply(name: str, args: dict[str, Any], prompt: int = 50) -> httpx.Response:
    return httpx.Response(200, json={
        "id": "c", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{name}_{prompt}", "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)}}]}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7}})


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")


async def test_respx_tool_call_rejection_then_pass_with_usage_and_cost() -> None:
    with respx.mock(assert_all_mocked=True) as mock:
        route = mock.post(URL).mock(side_effect=[
            httpx.Response(500, json={"error": {"message": "overloaded"}}),
            tool_reply("add", {"a": 2, "b": 2}, 100),
            tool_reply("final_output", {"value": 4}, 120),
            tool_reply("final_output", {"value": 5}, 140)])
        agent = Agent(instructions="Compute.", model="openai/gpt-4o-mini", tools=[add],
                      output_type=Sum, verifier=verify, retry=FAST)
        result = await agent.run("2 + 3?")
    assert (result.status, result.output) == ("completed", 5)
    assert result.events.count("model_error") == 1
    assert result.context.verification.attempts_used == 1
    assert result.usage.prompt_tokens == 360 and result.usage.completion_tokens == 21
    assert result.usage.cost_usd > 0, "a priced model's spend is recorded"
    bodies = [json.loads(c.request.content) for c in route.calls]
    assert [t["function"]["name"] for t in bodies[1]["tools"]] == ["add", "final_output"]
    assert all(b["max_tokens"] == 4096 for b in bodies)  # every turn bounded at the server
    last = bodies[3]["messages"]
    assert last[-2]["tool_calls"][0]["function"]["name"] == "final_output"
    assert last[-1]["role"] == "tool" and 'code="wrong_sum"' in last[-1]["content"]
    assert [m["role"] for m in last][:3] == ["system", "user", "assistant"]


async def test_loopback_server_end_to_end_and_what_the_model_was_sent() -> None:
    script = [reply(tool_call("add", {"a": 2, "b": 3})), final_output(value=4),
              final_output(value=5)]
    with FakeModelServer(script) as server:
        agent = Agent(model=server.model, model_settings=server.settings(), tools=[add],
                      output_type=Sum, verifier=verify, retry=FAST)
        result = await agent.run("2 + 3?")
    assert (result.status, result.output) == ("completed", 5)
    assert result.usage.prompt_tokens == 30 and result.usage.model == server.model
    assert len(server.bodies) == 3 and "_skip_mcp" not in server.sent()
    tool_answer = server.bodies[1]["messages"][-1]
    assert tool_answer == {"role": "tool", "tool_call_id": script[0].tool_calls[0].id,
                           "content": "5"}
    assert "<verification_rejected" in server.bodies[2]["messages"][-1]["content"]


async def test_loopback_server_faults_are_retried_then_fail_the_run() -> None:
    with FakeModelServer([503, 503, 503]) as server:
        agent = Agent(model=server.model, model_settings=server.settings(), output_type=Sum,
                      retry=FAST)
        result = await agent.run("q")
    assert (result.status, result.error) == ("failed", "model_error")
    assert len(server.bodies) == 3 and result.events.count("model_error") == 3
