"""A Choir Agent as a member of a plan (seed 000's team contract): the member submits
``final_output``, its verifier (the item's green threads, in sandboxes) gates it at the
member's task boundary, and the plan sees only the outcome: a rejected output is revision
(bounded feedback back to the agent), never merged; the accepted one is verified again by the
loop, merged through the gate, and the member's tokens are counted in the plan's record.

The model is scripted and served from 127.0.0.1 (``FakeModelServer``): the real litellm
path, no network.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from choir.team.driver import run_plan
from choir.team.plan import load_plan
from choir.testing import FakeModelServer, final_output, reply, tool_call
from tests.team import git, team_repo

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
              pytest.mark.slow]
CANARY = "CANARY-agent-member-must-never-see-raw-output"


def test_an_agent_members_final_output_is_gated_at_its_task_boundary(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = team_repo(tmp_path / "repo")
    # the check prints a canary when it fails: raw output that must never reach the model
    check = (repo / "test_tree.py").read_text().replace(
        "    for p in here.glob('*.txt'):", f"    print('{CANARY}')\n    for p in "
        "here.glob('*.txt'):")
    (repo / "test_tree.py").write_text(check)
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "canary")
    script = [reply(tool_call("write_file", {"path": "a.txt", "content": "BROKEN\n"})),
              final_output(summary="a.txt written"),
              reply(tool_call("write_file", {"path": "a.txt", "content": "A\n"})),
              final_output(summary="a.txt holds A")]
    with FakeModelServer(script) as server:
        monkeypatch.setenv("OPENAI_API_BASE", server.api_base)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        plan = tmp_path / "plan.yaml"
        plan.write_text(f"""\
id: ag
repo: ./repo
base: main
members:
  writer:
    executor: {{kind: llm, model: {server.model}, verifier_max_attempts: 3}}
items:
  - id: a
    goal: a.txt must hold the line A
    member: writer
    max_attempts: 1
  - id: b
    goal: copy a into b
    executor: {{kind: command, command: 'cp a.txt b.txt'}}
    depends_on: [a]
""")
        state = asyncio.run(run_plan(load_plan(plan)))
    rows = state["items"]
    assert {k: r["state"] for k, r in rows.items()} == {"a": "merged", "b": "merged"}, rows
    assert state["status"] == "asserted"
    # one item run, one executor attempt: the rejection was revision inside the member's
    # task, and the plan saw only the accepted output
    assert rows["a"]["attempt"] == 1 and rows["a"].get("sent_back", 0) == 0
    assert len(server.bodies) == 4
    rejected = server.bodies[2]["messages"][-1]
    assert rejected["role"] == "tool" and 'code="verification_failed"' in rejected["content"]
    assert CANARY not in server.sent(), "raw verifier output reached the member's model"
    # what was merged is the accepted output; the rejected one is on no branch of the plan
    item_commit = rows["a"]["commit"]
    assert git(repo, "show", f"{item_commit}:a.txt") == "A"
    assert git(repo, "show", f"{state['integration']}:b.txt") == "A"
    history = git(repo, "log", "--format=%H", state["integration"]).split()
    assert all("BROKEN" not in git(repo, "show", f"{c}:a.txt") for c in history
               if "a.txt" in git(repo, "ls-tree", "--name-only", c).split())
    # the member's gate checks were sealed and attested (lens executor_gate), both of them
    lenses = [json.loads(p.read_text())["body"]["lens"]
              for p in (choir_home / "attestations").glob("*.json")]
    assert lenses.count("executor_gate") == 2, lenses
    spend = state["spend"]["writer"]
    assert spend["prompt_tokens"] > 0 and spend["completion_tokens"] > 0, state["spend"]
