"""OpenTelemetry spans of a real ``choir verify`` and a real ``choir run``, caught by the SDK's
in-memory exporter: the span tree, the attributes, and no raw output anywhere in them."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from choir.testing import FakeModelServer, text
from tests.otelspans import all_text, by_name, parent_of, recording
from tests.workitems import STEP_PY, calc_repo, fixing_item

pytestmark = pytest.mark.slow  # CI's slow stage: the README's command stays under five minutes

pytest.importorskip("opentelemetry.sdk")

OUT_CANARY = "CANARY-otel-9d2e-verifier-output-must-not-be-exported"
REPLY_CANARY = "CANARY-otel-51af-model-reply-must-not-be-exported"
REPORTER_REPLY = json.dumps({"summary": f"the add test fails {REPLY_CANARY}",
                             "next_actions": [f"fix add {REPLY_CANARY}"], "confidence": 0.5})


def sandbox() -> str:
    return "bwrap" if shutil.which("bwrap") else "local"


def choir(*args: str) -> int:
    """The real CLI in this process (so the in-memory exporter sees its spans)."""
    from choir.cli import main

    with pytest.raises(SystemExit) as ended:
        main(list(args))
    code = ended.value.code
    return code if isinstance(code, int) else 0


def verify_repo(path: Path, model: str) -> Path:
    path.mkdir()
    (path / "loud.py").write_text(f"print({OUT_CANARY!r})\nraise SystemExit(1)\n")
    (path / "choir.yaml").write_text(textwrap.dedent(f"""\
        verifiers:
          loud:
            kind: unit_tests
            steps:
              - name: shout
                command: {STEP_PY} loud.py
          quiet:
            kind: unit_tests
            steps:
              - name: ok
                command: "true"
        models: {{reporter: {model}}}
        """))
    return path


def test_verify_spans_form_a_tree_with_verdicts_and_hashes_and_no_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeModelServer([text(REPORTER_REPLY)], name="reporter", repeat_last=True) as server, \
            recording() as exporter:
        monkeypatch.setenv("OPENAI_API_BASE", server.api_base)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        repo = verify_repo(tmp_path / "repo", server.model)
        code = choir("verify", "--repo", str(repo), "--json", "--sandbox", sandbox(), "--otel")
        sent = server.sent()
    contract = json.loads(capsys.readouterr().out)
    assert code == 1 and contract["status"] == "FAIL"
    spans = exporter.get_finished_spans()
    [root] = by_name(spans, "choir.verify")
    assert root.parent is None
    assert root.attributes["choir.run_id"] == contract["run_id"]
    assert root.attributes["choir.status"] == "FAIL"
    assert root.attributes["choir.verdict"] == "FAIL"
    assert root.attributes["choir.crashed"] == 0
    [rnd] = by_name(spans, "choir.round")
    assert parent_of(spans, rnd) is root and rnd.attributes["choir.round.kind"] == "verify"
    threads = {s.attributes["choir.verifier"]: s for s in by_name(spans, "choir.green_thread")}
    assert set(threads) == {"loud", "quiet"}
    reports = {r["verifier"]: r for r in contract["reports"]}
    for name, thread in threads.items():
        assert parent_of(spans, thread) is rnd
        attrs = thread.attributes
        assert attrs["choir.sandbox"] == sandbox()
        assert attrs["choir.isolation"] in {"namespace", "none"}
        assert attrs["choir.verdict"] == reports[name]["result"]
        assert attrs["choir.report_hash"].startswith("blake3:") or attrs["choir.report_hash"]
        assert attrs["choir.manifest_hash"] in contract["manifest"]["runs"].values()
        assert attrs["choir.duration_s"] > 0
        [attest] = [s for s in by_name(spans, "choir.attest")
                    if s.attributes["choir.run_id"] == attrs["choir.run_id"]]
        assert parent_of(spans, attest) is thread
        assert attest.attributes["choir.attestation.id"] in contract["attestations"]
    # the reporter's model call: GenAI conventions, under the green thread it reported on
    calls = [s for s in spans if s.name.startswith("chat ")]
    assert calls, "no model-call span"
    for call in calls:
        assert parent_of(spans, call).name == "choir.green_thread"
        assert call.attributes["gen_ai.operation.name"] == "chat"
        assert call.attributes["gen_ai.request.model"] == server.model
        assert call.attributes["gen_ai.provider.name"] == "openai"
        assert call.attributes["gen_ai.system"] == "openai"
        assert call.attributes["gen_ai.usage.input_tokens"] == 10
        assert call.attributes["gen_ai.usage.output_tokens"] == 5
        assert "choir.cost_usd" in call.attributes
    # the canaries reached the artifacts and the model, and no span
    assert OUT_CANARY in sent
    assert REPLY_CANARY in json.dumps(contract["reports"])
    exported = all_text(spans)
    assert OUT_CANARY not in exported and REPLY_CANARY not in exported
    assert len({s.context.trace_id for s in spans}) == 1


def test_run_spans_rounds_attempts_threads_and_model_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeModelServer([text(REPORTER_REPLY)], name="models", repeat_last=True) as server:
        calc_repo(tmp_path / "repo", canary=OUT_CANARY, sandbox=sandbox(),
                  extra=f"models: {{reporter: {server.model}}}\n")
        item = fixing_item(tmp_path)
        monkeypatch.setenv("OPENAI_API_BASE", server.api_base)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        monkeypatch.setenv("CHOIR_OTEL", "1")  # the variable, not the flag
        with recording() as exporter:
            code = choir("run", str(item), "--json")
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "asserted" and out["attempt"] == 2
    spans = exporter.get_finished_spans()
    [root] = by_name(spans, "choir.run")
    assert root.parent is None and root.attributes["choir.status"] == "asserted"
    attempts = sorted(by_name(spans, "choir.executor.attempt"),
                      key=lambda s: s.attributes["choir.attempt"])
    assert [a.attributes["choir.attempt"] for a in attempts] == [1, 2]
    for attempt in attempts:
        assert parent_of(spans, attempt) is root
        assert attempt.attributes["choir.executor"] == "command"
        assert attempt.attributes["choir.executor.exit_code"] == 0
    rounds = sorted(by_name(spans, "choir.round"), key=lambda s: s.attributes["choir.round"])
    assert [r.attributes["choir.round"] for r in rounds] == [f"{out['run_id']}-r0",
                                                           f"{out['run_id']}-r1"]
    assert [r.attributes["choir.action"] for r in rounds] == ["retry", "done"]
    threads = by_name(spans, "choir.green_thread")
    assert len(threads) == 2
    for rnd, verdict in zip(rounds, ["FAIL", "PASS"], strict=True):
        assert parent_of(spans, rnd) is root
        [thread] = [t for t in threads if parent_of(spans, t) is rnd]
        assert thread.attributes["choir.verdict"] == verdict
        [attest] = [s for s in by_name(spans, "choir.attest") if parent_of(spans, s) is thread]
        assert attest.attributes["choir.attestation.id"]
    calls = [s for s in spans if s.name.startswith("chat ")]
    assert calls and all(parent_of(spans, c).name == "choir.green_thread" for c in calls)
    assert sum(c.attributes["gen_ai.usage.input_tokens"] for c in calls) == \
        out["usage"]["reporter"]["prompt_tokens"]
    exported = all_text(spans)
    assert OUT_CANARY not in exported and REPLY_CANARY not in exported


def test_an_llm_executor_attempt_holds_its_model_calls_and_gate_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from choir.testing import final_output, reply, tool_call

    right = "def add(a, b):\n    return a + b\n"
    script = [reply(tool_call("write_file", {"path": "calc.py", "content": right}),
                    content=REPLY_CANARY),
              final_output(summary=f"fixed {REPLY_CANARY}")]
    with FakeModelServer(script) as server:
        calc_repo(tmp_path / "repo", canary=OUT_CANARY, sandbox=sandbox())
        item = tmp_path / "item.yaml"
        item.write_text(f"id: fix-add-llm\ngoal: add must add\nrepo: ./repo\nmax_attempts: 1\n"
                        f"executor:\n  kind: llm\n  model: {server.model}\n")
        monkeypatch.setenv("OPENAI_API_BASE", server.api_base)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        with recording() as exporter:
            code = choir("run", str(item), "--json", "--otel")
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "asserted", out
    spans = exporter.get_finished_spans()
    [attempt] = by_name(spans, "choir.executor.attempt")
    assert attempt.attributes["choir.executor"] == "llm"
    calls = [s for s in spans if s.name.startswith("chat ")]
    assert len(calls) == 2 and all(parent_of(spans, c) is attempt for c in calls)
    assert sum(c.attributes["gen_ai.usage.output_tokens"] for c in calls) == 10
    # the agent's gate check ran its verifiers as green threads inside the attempt
    gate = [t for t in by_name(spans, "choir.green_thread")
            if "-check" in t.attributes["choir.run_id"]]
    assert gate and all(parent_of(spans, t) is attempt for t in gate)
    exported = all_text(spans)
    assert OUT_CANARY not in exported and REPLY_CANARY not in exported


if sys.platform != "linux":  # pragma: no cover - bwrap and the loopback model are Linux here
    pytestmark = pytest.mark.skip("Linux only")
