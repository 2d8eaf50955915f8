"""The ``llm`` executor end to end: `choir run` drives an agent served from 127.0.0.1.

The agent edits the repo through its file tools; its ``final_output`` is gated by the
green-thread verification (a wrong fix is rejected with bounded feedback, a right one
passes); then the Director loop verifies again, attests and ASSERTs. Nothing the failing
test printed ever reaches the model.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from choir.testing import FakeModelServer, final_output, reply, text, tool_call
from tests import forked
from tests.workitems import PY, calc_repo

pytestmark = pytest.mark.slow  # CI's slow stage: the README's command stays under five minutes

CANARY = "CANARY-5b1e-llm-executor-must-never-see-raw-output"
WRONG = "def add(a, b):\n    return a * b\n"
RIGHT = "def add(a, b):\n    return a + b\n"


def make_item(tmp_path: Path, model: str) -> Path:
    calc_repo(tmp_path / "repo", canary=CANARY, sandbox="bwrap")
    item = tmp_path / "item.yaml"
    item.write_text(textwrap.dedent(f"""\
        id: fix-add-llm
        goal: add(a, b) must return the sum
        repo: ./repo
        max_attempts: 2
        executor:
          kind: llm
          model: {model}
        """))
    return item


def choir(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      env=env, timeout=300)


@pytest.mark.slow
def test_llm_executor_is_gated_by_green_threads_and_asserted(tmp_path: Path) -> None:
    script = [reply(tool_call("read_file", {"path": "calc.py"})),
              reply(tool_call("write_file", {"path": "calc.py", "content": WRONG})),
              final_output(summary="add fixed"),
              reply(tool_call("write_file", {"path": "calc.py", "content": RIGHT})),
              final_output(summary="add returns a + b")]
    with FakeModelServer(script) as server:
        item = make_item(tmp_path, server.model)
        env = dict(os.environ, OPENAI_API_BASE=server.api_base, OPENAI_API_KEY="sk-fake")
        proc = choir("run", str(item), "--json", env=env)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = json.loads(proc.stdout)
    assert out["status"] == "asserted" and out["attempt"] == 1
    assert (tmp_path / "repo" / "calc.py").read_text() == RIGHT
    assert len(server.bodies) == 5
    rejected = server.bodies[3]["messages"][-1]
    assert rejected["role"] == "tool" and 'code="verification_failed"' in rejected["content"]
    assert "test_add" in rejected["content"]
    assert CANARY not in server.sent(), "raw verifier output reached the model"
    tools = [t["function"]["name"] for t in server.bodies[0]["tools"]]
    assert tools == ["list_files", "read_file", "search", "write_file", "apply_patch",
                     "final_output"]
    gate = choir("gate", "fix-add-llm", "--repo", str(tmp_path / "repo"), env=env)
    assert gate.returncode == 0, gate.stdout
    # issue #11 item 13: the agent's own gate runs are sealed AND attested (lens executor_gate)
    audit = choir("audit", "--json", env=env)
    assert audit.returncode == 0, audit.stdout[:2000]
    lenses = [json.loads(p.read_text())["body"]["lens"]
              for p in (Path(env["CHOIR_HOME"]) / "attestations").glob("*.json")]
    assert lenses.count("executor_gate") == 2, lenses  # the rejected check and the passing one


def test_llm_executor_without_a_model_is_a_configuration_error(tmp_path: Path) -> None:
    item = make_item(tmp_path, "x")
    item.write_text(item.read_text().replace("  model: x\n", ""))
    proc = choir("run", str(item), env=dict(os.environ))
    assert proc.returncode == 2, proc.stderr
    assert "executor kind 'llm' needs a model" in proc.stderr
    assert "models.executor" in proc.stderr


def test_the_work_item_bounds_every_turn_of_the_llm_executor(tmp_path: Path) -> None:
    """``executor.max_tokens``: a slow local model writes 10-100 tokens a second, and a turn
    of 4,096 outlived the whole attempt there (the server finishes a reply nobody waits for)."""
    with FakeModelServer([text("I will think about it.")], repeat_last=True) as server:
        item = make_item(tmp_path, server.model)
        item.write_text(item.read_text().replace("max_attempts: 2", "max_attempts: 1")
                        + "  max_tokens: 256\n")
        env = dict(os.environ, OPENAI_API_BASE=server.api_base, OPENAI_API_KEY="sk-fake")
        proc = choir("run", str(item), "--json", env=env)
    assert proc.returncode == 1, proc.stderr  # no tool call ever: the evidence says FAIL
    assert json.loads(proc.stdout)["status"] == "halted"
    assert server.bodies and all(b["max_tokens"] == 256 for b in server.bodies)


def test_a_model_outage_spends_no_attempt_and_resume_asks_again(tmp_path: Path) -> None:
    """A model server down (503 on every try, the agent's own retries included) was a
    failed attempt: with ``max_attempts: 1`` the run halted, its budget spent on an outage,
    and a resume could only halt again (the agent's run was stored as failed). Now ``choir
    run`` stops before recording the attempt (exit 4, the reason said), the agent's run is
    put back as it stood before the call, and ``--resume`` with the model back finishes it
    at attempt 1."""
    with FakeModelServer([503], repeat_last=True) as down:
        item = make_item(tmp_path, down.model)
        item.write_text(item.read_text().replace("max_attempts: 2", "max_attempts: 1"))
        env = dict(os.environ, OPENAI_API_BASE=down.api_base, OPENAI_API_KEY="sk-fake")
        proc = choir("run", str(item), "--run-id", "outage", env=env)
    assert proc.returncode == 4, proc.stderr + proc.stdout
    assert "did not answer" in proc.stderr and "no attempt was charged" in proc.stderr
    assert len(down.bodies) == 3  # the agent's own bounded retries, then the stop
    script = [reply(tool_call("write_file", {"path": "calc.py", "content": RIGHT})),
              final_output(summary="add returns a + b")]
    with FakeModelServer(script) as back:
        env = dict(env, OPENAI_API_BASE=back.api_base)
        again = choir("run", "--resume", "outage", "--json", env=env)
    assert again.returncode == 0, again.stderr + again.stdout
    out = json.loads(again.stdout)
    assert out["status"] == "asserted" and out["attempt"] == 1, out
    assert back.bodies[0]["messages"] == down.bodies[0]["messages"]  # asked again, same turn
