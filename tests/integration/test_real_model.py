"""A real model end to end: SmolLM2-135M behind llama.cpp's server on 127.0.0.1.

The reporter, the Director's model and the ``llm`` executor, each over real HTTP through
litellm, against a model whose output is what it is (often wrong, sometimes off-topic):
whatever it writes, the evidence decides. A failing repo stays FAIL, a passing one PASSes,
every report is bounded and validated, every call carries its output bound and, for the
structured roles, the reply's schema in the form this server enforces; the executor's run
ends within its budget, ASSERTed only when the verifiers pass.

The ``realmodel`` profile (``pip install -e '.[realmodel]'``) is opt-in and slow: CI runs
these tests in its slow stage (``-m realmodel -n 0``), one server for the module.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from choir.director.advisor import REPLY_MAX as DIRECTOR_REPLY_MAX
from choir.exceptions import SandboxError
from choir.llm import ask_json, reply_tokens
from choir.models import VerificationReport
from choir.models.report import NEXT_ACTION_MAX, SUMMARY_MAX
from choir.report.reporter import REPLY_MAX as REPORTER_REPLY_MAX
from choir.report.reporter import _Reply as ReporterReply
from choir.testing.local_model import LocalModelServer
from tests import forked
from tests.realmodel import Recorder, local_model_or_skip, profile_or_skip
from tests.workitems import FIXED, PY, calc_repo

pytestmark = [pytest.mark.slow, pytest.mark.realmodel]

CANARY = "CANARY-9d2f-the-director-must-never-see-raw-output"
# what a reply the client gave up on may still take at the server: its bound, at a few
# tokens a second on a loaded machine
DRAIN_S = 300
# the llm executor's attempt and each of its turns: SmolLM2 writes prose, not tool calls, and
# a turn may run to its bound (4,096 tokens by default: 40 s quiet, minutes on a busy machine)
ATTEMPT_S = 90
TURN_TOKENS = 256
SCAN = """\
    scan:
      kind: security_scan
      steps: [{name: scan, command: "true"}]
    """


@pytest.fixture(scope="module")
def server() -> Iterator[LocalModelServer]:
    started = local_model_or_skip()
    yield started
    started.stop()


@pytest.fixture
def wire(server: LocalModelServer) -> Iterator[Recorder]:
    with Recorder(upstream=f"http://127.0.0.1:{server.port}") as recorder:
        yield recorder
        # replies nobody waits for any more still run to their bound: the next test starts
        # on an idle server
        recorder.drain(DRAIN_S)


def model_env(server: LocalModelServer, wire: Recorder) -> dict[str, str]:
    return dict(os.environ, **{**server.env(), "OPENAI_API_BASE": wire.api_base})


def choir(*args: str, env: dict[str, str],
          timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True, env=env,
                      timeout=timeout)


def structured(exchange_body: dict[str, object], reply_max: int) -> None:
    """A structured role's request: its output bound, and its schema in this server's form."""
    assert exchange_body["max_tokens"] == reply_tokens(reply_max)
    form = exchange_body["response_format"]
    assert isinstance(form, dict) and form["type"] == "json_object", form
    assert isinstance(form.get("schema"), dict) and form["schema"].get("properties"), form


def test_the_server_holds_replies_to_the_schema_and_the_token_bound(
        server: LocalModelServer, wire: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOIR_MODEL_SCHEMA", "json_object_schema")
    question = [{"role": "user", "content": "A test run: 3 tests, 1 failed (test_add: "
                                            "assert 5 == -1). Report on it as JSON."}]
    reply, spent, fault = asyncio.run(ask_json(
        server.model, question, ReporterReply, deadline_s=60, reply_max=REPORTER_REPLY_MAX,
        api_base=wire.api_base, api_key=server.api_key, temperature=0))
    assert reply is not None, f"the grammar should hold the reply to the schema: {fault}"
    [sent] = wire.exchanges
    structured(sent.body, REPORTER_REPLY_MAX)
    assert sent.status == 200 and 0 < sent.completion_tokens <= sent.body["max_tokens"]
    assert spent.completion_tokens == sent.completion_tokens  # what litellm counted

    # the bound is the server's to enforce: a reply asked to run long is cut at it
    long, _, _ = asyncio.run(ask_json(
        server.model, [{"role": "user", "content": "Write a very long story, as JSON."}],
        ReporterReply, deadline_s=60, reply_max=REPORTER_REPLY_MAX, max_tokens=16, attempts=1,
        api_base=wire.api_base, api_key=server.api_key))
    cut = wire.exchanges[-1]
    assert cut.body["max_tokens"] == 16 and cut.completion_tokens <= 16
    assert cut.reply["choices"][0]["finish_reason"] == "length"
    assert long is None  # 16 tokens cannot close the object: refused, never half-parsed

    # OpenAI's form of the same request is refused by this server (hence the setting)
    monkeypatch.setenv("CHOIR_MODEL_SCHEMA", "json_schema")
    refused, _, fault = asyncio.run(ask_json(
        server.model, question, ReporterReply, deadline_s=30, attempts=1,
        api_base=wire.api_base, api_key=server.api_key))
    assert refused is None and wire.exchanges[-1].status >= 400, fault
    assert "Input should be 'text' or 'json_object'" in json.dumps(wire.exchanges[-1].reply)


def failing_repo(tmp_path: Path, server: LocalModelServer) -> Path:
    return calc_repo(tmp_path / "repo", canary=CANARY, sandbox="bwrap", verifiers=SCAN,
                     extra=f"models: {{reporter: {server.model}, director: {server.model}}}\n")


def bounded_reports(out: dict[str, object]) -> list[VerificationReport]:
    """Every report of a ``choir verify --json``, validated as a report and within bounds."""
    reports = [VerificationReport.model_validate(r) for r in out["reports"]]  # type: ignore[attr-defined]
    for report in reports:
        assert report.reporter in ("model", "deterministic_fallback"), report.reporter
        assert len(report.summary) <= SUMMARY_MAX
        assert all(len(a) <= NEXT_ACTION_MAX for a in report.next_actions)
        assert CANARY not in report.summary + "".join(report.next_actions)
    return reports


def test_verify_holds_fail_whatever_the_model_says(
        tmp_path: Path, server: LocalModelServer, wire: Recorder) -> None:
    repo = failing_repo(tmp_path, server)
    began = time.monotonic()
    proc = choir("verify", "--repo", str(repo), "--json", env=model_env(server, wire))
    took = time.monotonic() - began
    assert proc.returncode == 1, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "FAIL"
    reports = {r.verifier: r for r in bounded_reports(out)}
    assert reports["unit"].result.value == "FAIL"  # a model never turns FAIL into PASS
    assert set(out["plan"]) <= {"unit", "scan"}
    reporter, director = wire.by_role("reporter"), wire.by_role("director")
    assert director and reporter, [e.role() for e in wire.exchanges]
    for call in reporter:
        structured(call.body, REPORTER_REPLY_MAX)
    for call in director:
        structured(call.body, DIRECTOR_REPLY_MAX)
        assert CANARY not in json.dumps(call.body), "raw output reached the Director's model"
    # the Director's and the reporters' deadlines (30 s each) bound the whole verification
    assert took < 150, took
    for call in wire.drain(DRAIN_S):  # the server held every reply to its bound
        assert call.completion_tokens <= call.body["max_tokens"], call


def test_verify_passes_a_passing_repo(tmp_path: Path, server: LocalModelServer,
                                      wire: Recorder) -> None:
    repo = failing_repo(tmp_path, server)
    (repo / "calc.py").write_text(FIXED)
    proc = choir("verify", "--repo", str(repo), "--json", env=model_env(server, wire))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "PASS"
    assert all(r.result.value == "PASS" for r in bounded_reports(out))
    assert wire.by_role("reporter"), "the reporter's model was not asked"


def test_the_llm_executor_ends_within_its_budget_and_the_evidence_decides(
        tmp_path: Path, server: LocalModelServer, wire: Recorder) -> None:
    calc_repo(tmp_path / "repo", canary=CANARY, sandbox="bwrap")
    item = tmp_path / "item.yaml"
    item.write_text(textwrap.dedent(f"""\
        id: fix-add-smollm2
        goal: "calc.py: add(a, b) must return a + b (it returns a - b)"
        repo: ./repo
        max_attempts: 1
        executor:
          kind: llm
          model: {server.model}
          timeout_s: {ATTEMPT_S}
          max_turns: 4
          max_tokens: {TURN_TOKENS}
          verifier_max_attempts: 1
        """))
    env = model_env(server, wire)
    began = time.monotonic()
    proc = choir("run", str(item), "--json", env=env, timeout=900)
    took = time.monotonic() - began
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    gate = choir("gate", "fix-add-smollm2", "--repo", str(tmp_path / "repo"), env=env)
    fixed = (tmp_path / "repo" / "calc.py").read_text() == FIXED
    print(f"\nSmolLM2 as the llm executor: status {out['status']} after {out['attempt']} "
          f"attempt(s) in {took:.0f} s; {len(wire.by_role('executor'))} model call(s); "
          f"calc.py fixed: {fixed}; gate exit {gate.returncode}")
    # one attempt of at most ATTEMPT_S, and the verification round after it
    assert took < ATTEMPT_S + 150, took
    calls = wire.by_role("executor")
    assert calls, "the executor's model was never asked"
    for call in calls:
        assert call.body["max_tokens"] == TURN_TOKENS
        assert CANARY not in json.dumps(call.body), "raw output reached the executor's model"
    for call in wire.drain(DRAIN_S):
        assert call.completion_tokens <= call.body["max_tokens"], call
    if out["status"] == "asserted":
        assert gate.returncode == 0, gate.stdout  # ASSERT only on the verifiers' PASS
    else:
        assert gate.returncode == 1, gate.stdout
        assert out["status"] in ("halted", "escalated"), out["status"]


def test_a_model_server_killed_mid_call_costs_only_the_wording(tmp_path: Path) -> None:
    doomed = local_model_or_skip()  # its own server: this test kills it with SIGKILL
    try:
        with Recorder(upstream=f"http://127.0.0.1:{doomed.port}") as wire:
            repo = failing_repo(tmp_path, doomed)
            proc = subprocess.Popen([PY, "-m", "choir", "verify", "--repo", str(repo), "--json"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=model_env(doomed, wire))
            assert wire.arrived.wait(120), "no model call was made"
            doomed.kill()
            stdout, stderr = proc.communicate(timeout=300)
    finally:
        doomed.stop()
    assert proc.returncode == 1, stderr[-3000:]
    out = json.loads(stdout)
    assert out["status"] == "FAIL"
    reports = bounded_reports(out)
    assert {r.reporter for r in reports} == {"deterministic_fallback"}
    assert "director model gave no usable plan" in stderr


def test_a_server_that_cannot_load_its_model_says_why_and_leaves_nothing(
        tmp_path: Path) -> None:
    profile_or_skip()
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    server = LocalModelServer(model_path=bad, start_timeout_s=60)
    with pytest.raises(SandboxError, match="did not start") as err:
        server.start()
    assert f"(exit code 1): ValueError: Failed to load model from file: {bad}" in str(err.value)
    assert not server.running()


def test_a_port_that_is_taken_is_named_not_replaced(tmp_path: Path) -> None:
    profile_or_skip()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = LocalModelServer(port=port)
        with pytest.raises(SandboxError, match="address already in use"):
            server.start()
    assert server.port == port and not server.running()
