"""Typed functions become tools: schemas, validation, injection, errors the model can fix."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from choir import Agent, AgentContext, ExecutionContext
from choir.agent import RetryPolicy, tool
from choir.exceptions import FatalAgentError, ToolInputError
from choir.testing import FakeModel, final_output, reply, tool_call

FAST = RetryPolicy(max_retries=0, backoff_s=0.0)


def add(a: int, b: int = 2, *, agent_ctx: AgentContext) -> int:
    """Add two numbers.

    Longer explanation the model does not need.

    Args:
        a: the first number.
        b: the second number,
            defaulting to two.
    """
    assert isinstance(agent_ctx, AgentContext)
    return a + b


async def lookup(key: str, run: ExecutionContext) -> dict[str, Any]:
    """Look a key up in the caller's dependencies."""
    table: dict[str, Any] = run.deps
    if key not in table:
        raise ToolInputError(f"no key {key!r}; known keys: {sorted(table)}")
    return {"key": key, "value": table[key]}


class Answer(BaseModel):
    value: int


def test_schema_comes_from_the_signature_and_docstring_and_hides_injected_params() -> None:
    schema = tool(add).schema()["function"]
    assert schema["name"] == "add" and schema["description"] == "Add two numbers."
    params = schema["parameters"]
    assert set(params["properties"]) == {"a", "b"} and params["required"] == ["a"]
    assert params["properties"]["a"] == {"type": "integer", "description": "the first number."}
    assert params["properties"]["b"]["description"] == "the second number, defaulting to two."
    assert params["additionalProperties"] is False
    assert tool(lookup).schema()["function"]["parameters"]["required"] == ["key"]


async def test_the_model_calls_tools_with_injection_and_sees_the_results() -> None:
    model = FakeModel([reply(tool_call("add", {"a": 40}), tool_call("lookup", {"key": "k"})),
                       final_output(value=42)])
    agent = Agent(model=model, tools=[add, lookup], output_type=Answer, retry=FAST)
    result = await agent.run("q", deps={"k": "v"})
    assert result.output == Answer(value=42)
    answers = [m for m in model.requests[1] if m["role"] == "tool"]
    assert [a["content"] for a in answers] == ["42", '{"key": "k", "value": "v"}']
    assert result.events.count("tool_called") == 2
    names = [t["function"]["name"] for t in model.tool_sets[0]]
    assert names == ["add", "lookup", "final_output"]


async def test_tool_errors_the_model_can_fix_are_told_to_it() -> None:
    model = FakeModel([reply(tool_call("lookup", {"key": "nope"})),
                       reply(tool_call("add", {"a": "forty"})),
                       reply(tool_call("rm_rf", {})),
                       final_output(value=1)])
    agent = Agent(model=model, tools=[add, lookup], output_type=Answer, retry=FAST,
                  max_invalid_responses=5)
    result = await agent.run("q", deps={"k": 1})
    assert result.status == "completed"
    told = [m["content"] for m in result.context.messages if m["role"] == "tool"]
    assert "no key 'nope'; known keys: ['k']" in told[0]
    assert "Invalid arguments for add" in told[1] and "a" in told[1]
    assert "Unknown tool 'rm_rf'" in told[2] and "lookup" in told[2]
    assert result.context.invalid_responses == 2


async def test_a_fatal_tool_error_fails_the_run() -> None:
    def deploy() -> str:
        """Deploy."""
        raise FatalAgentError("deploys are forbidden here")

    model = FakeModel([reply(tool_call("deploy")), final_output(value=1)])
    result = await Agent(model=model, tools=[deploy], output_type=Answer).run("q")
    assert (result.status, result.error, model.calls) == ("failed", "fatal", 1)
    assert "deploys are forbidden" in result.message


async def test_tool_results_are_bounded_with_an_explicit_marker() -> None:
    def dump() -> str:
        """A lot of text."""
        return "x" * 100_000

    model = FakeModel([reply(tool_call("dump")), final_output(value=1)])
    result = await Agent(model=model, tools=[dump], output_type=Answer).run("q")
    content = next(m["content"] for m in result.context.messages if m["role"] == "tool")
    assert len(content) < 33_000 and "[truncated: 68000 more characters not shown]" in content


def test_reserved_and_duplicate_names_are_refused() -> None:
    import pytest

    def final_output() -> None:
        """Not allowed."""

    for tools in ([final_output], [add, add]):
        with pytest.raises(ValueError, match="used twice or reserved"):
            Agent(model=FakeModel([]), tools=tools)
