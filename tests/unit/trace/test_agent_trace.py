"""Durable Agent runs: the trace comes from the saved context (tool calls and replies by id)
and the store's save times; the accepted output is a claim grounded in the saved messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from choir import Agent
from choir.agent import SqliteContextStore
from choir.evidence.artifacts import ArtifactStore
from choir.testing import FakeModel, final_output, reply, tool_call
from choir.trace import RecordSources, verify_trace
from choir.trace.agent import export_agent


class Patch(BaseModel):
    summary: str


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def _run(tmp_path: Path, script: list[Any], verifier: Any = None) -> tuple[
        SqliteContextStore, ArtifactStore]:
    contexts = SqliteContextStore(tmp_path / "agents.sqlite")
    agent = Agent(instructions="fix it", model=FakeModel(script, repeat_last=True),
                  tools=[add], output_type=Patch, verifier=verifier, verifier_max_attempts=2)
    await agent.run("q", run_id="job", store=contexts)
    return contexts, ArtifactStore(tmp_path / "artifacts")


def _checks(result: Any) -> set[str]:
    return {f.check for f in result.failures}


async def test_an_agent_run_trace_links_calls_and_grounds_its_output(tmp_path: Path) -> None:
    contexts, store = await _run(tmp_path, [reply(tool_call("add", {"a": 2, "b": 3})),
                                            final_output(summary="5")])
    trace = export_agent("job", contexts, store)
    kinds = [e.kind for e in trace.events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_ended"
    assert kinds.count("tool_call") == kinds.count("tool_result") == 2
    assert [c.kind for c in trace.claims] == ["output"]
    raw = trace.model_dump(mode="json")
    assert verify_trace(raw, store).ok
    # held against a home: an agent trace is not sealed, and claims only its output
    sources = RecordSources(home=tmp_path / "home", store=store, trusted=())
    assert verify_trace(raw, store, sources=sources).ok
    relabelled = {**raw, "claims": [{**raw["claims"][0], "kind": "ASSERT"}]}
    assert _checks(verify_trace(relabelled, store, sources=sources)) == {"derived"}
    raw["events"] = [e for e in raw["events"] if not (e["kind"] == "tool_result"
                                                      and e["name"] == "add")]
    for n, event in enumerate(raw["events"]):
        event["seq"] = n + 1
    raw["claims"][0]["event_seq"] = len(raw["events"]) - 1
    assert _checks(verify_trace(raw, store)) == {"tool_linkage"}


async def test_the_saved_messages_ground_the_output(tmp_path: Path) -> None:
    contexts, store = await _run(tmp_path, [final_output(summary="done")])
    trace = export_agent("job", contexts, store)
    digest = trace.evidence[0].hash
    path = store.path_of(digest)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b"done", b"DONE"))
    assert {"evidence_integrity", "citation_hash"} <= _checks(
        verify_trace(trace.model_dump(mode="json"), store))


async def test_an_exhausted_agent_run_says_its_evidence_is_insufficient(tmp_path: Path) -> None:
    def never(output: Patch) -> Patch:
        from choir.exceptions import VerificationRejected

        raise VerificationRejected("not yet")

    contexts, store = await _run(tmp_path, [final_output(summary="x")], verifier=never)
    trace = export_agent("job", contexts, store)
    assert trace.outcome.status == "failed" and trace.outcome.insufficient_evidence
    assert trace.claims == () and verify_trace(trace.model_dump(mode="json"), store).ok


def test_an_unknown_agent_run_is_a_usage_error(tmp_path: Path) -> None:
    from choir.exceptions import UserError

    with pytest.raises(UserError, match="no agent run"):
        export_agent("nope", SqliteContextStore(tmp_path / "a.sqlite"),
                     ArtifactStore(tmp_path / "artifacts"))


async def test_output_text_cannot_forge_a_citation_marker(tmp_path: Path) -> None:
    """An output (or a log excerpt) that contains ``[@9]`` must not break or fake grounding."""
    contexts, store = await _run(tmp_path, [final_output(summary="see [@9] and [@1]")])
    trace = export_agent("job", contexts, store)
    assert verify_trace(trace.model_dump(mode="json"), store).ok
    assert trace.claims[0].text.count("[@") == 1
