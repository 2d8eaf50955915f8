"""What a hostile model sends cannot break a durable run's save or its trace (review 20b):
a tool-call id too long for a trace event, and a plain-text answer holding a lone surrogate."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from choir import Agent
from choir.agent import SqliteContextStore
from choir.agent.llm import ModelReply, ToolCall
from choir.evidence.artifacts import ArtifactStore
from choir.testing import FakeModel, final_output
from choir.trace import verify_trace
from choir.trace.agent import export_agent


class Out(BaseModel):
    summary: str


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def test_a_long_tool_call_id_still_exports_a_valid_trace(tmp_path: Path) -> None:
    """F3: ``L{line}/{model id}`` passed TraceEvent's 200 characters for a 250-character id,
    and ``choir trace export --agent-store`` crashed (exit 4). Two long ids that differ only
    at their ends must stay two calls."""
    ids = ("x" * 250 + "1", "x" * 250 + "2", "y" * 64)
    calls = tuple(ToolCall(id=i, name="add", arguments='{"a": 1, "b": 2}') for i in ids)
    contexts = SqliteContextStore(tmp_path / "agents.sqlite")
    agent = Agent(instructions="i", model=FakeModel([ModelReply(tool_calls=calls),
                                                    final_output(summary="done")]),
                  tools=[add], output_type=Out)
    result = await agent.run("q", run_id="job", store=contexts)
    assert result.status == "completed"
    store = ArtifactStore(tmp_path / "artifacts")
    trace = export_agent("job", contexts, store)
    adds = [e.call_id for e in trace.events if e.kind == "tool_call" and e.name == "add"]
    assert len(set(adds)) == 3 and all(c and len(c) <= 80 for c in adds)
    assert "L3/" + "y" * 64 in adds  # an id of 64 characters is kept as it is
    assert trace == export_agent("job", contexts, store)  # the same name every time
    assert verify_trace(trace.model_dump(mode="json"), store).ok


async def test_a_plain_text_answer_with_a_lone_surrogate_is_saved(tmp_path: Path) -> None:
    """F4: ``output_type=str`` took ``reply.content`` raw as the output, and the durable save
    raised PydanticSerializationError out of ``Agent.run``."""
    contexts = SqliteContextStore(tmp_path / "agents.sqlite")
    agent = Agent(instructions="i", model=FakeModel([ModelReply(content="done \ud800 x")]),
                  output_type=str)
    result = await agent.run("q", run_id="job", store=contexts)
    assert result.status == "completed" and result.output == "done \\ud800 x"
    saved = contexts.load("job")
    assert saved is not None and saved.output == result.output
