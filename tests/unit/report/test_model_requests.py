"""What every structured model call asks of the server: bounded output, and the reply's own
schema where the server can hold the model to it (plain JSON mode elsewhere)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import respx
from pydantic import BaseModel, Field

from choir.config import load_repo_config
from choir.exceptions import ConfigError
from choir.llm import _wire_schema, ask_json, parse_reply, reply_tokens, schema_form
from tests import forked
from tests.unit.report.test_reporter_model import completion


class _Verdict(BaseModel):
    result: str
    why: str


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")


@pytest.mark.parametrize(("model", "base", "kind"), [
    ("openai/gpt-4o-mini", "https://api.openai.com/v1", "json_schema"),
    # a small model behind a local OpenAI-compatible server: litellm knows nothing of it
    ("openai/smollm2-135m", "http://127.0.0.1:9/v1", "json_object"),
])
def test_bounded_output_and_the_schema_where_it_is_enforced(model: str, base: str,
                                                            kind: str) -> None:
    with respx.mock(assert_all_mocked=True) as mock:
        route = mock.post(f"{base}/chat/completions").mock(
            return_value=completion(json.dumps({"result": "FAIL", "why": "1 failed"})))
        reply, _, fault = asyncio.run(ask_json(
            model, [{"role": "user", "content": "3 tests, 1 failed: did it pass?"}], _Verdict,
            deadline_s=20, reply_max=2000, api_base=base))
    assert reply == _Verdict(result="FAIL", why="1 failed"), fault
    sent = json.loads(route.calls[0].request.content)
    assert sent["max_tokens"] == reply_tokens(2000) == 564
    assert sent["response_format"]["type"] == kind
    if kind == "json_schema":
        schema = sent["response_format"]["json_schema"]["schema"]
        assert schema["required"] == ["result", "why"]


@pytest.mark.parametrize(("form", "sent_form"), [
    # llama-cpp-python's server: a grammar from the schema inside JSON mode
    ("json_object_schema", {"type": "json_object", "schema": _Verdict.model_json_schema()}),
    # a server litellm does not know, declared to take OpenAI's form (llama-server, vLLM)
    ("json_schema", {"type": "json_schema", "json_schema": {
        "name": "_Verdict".strip("_"), "schema": _Verdict.model_json_schema(),
        "strict": False}}),
    ("json_object", {"type": "json_object"}),
])
def test_the_deployment_says_which_schema_form_its_server_takes(
        form: str, sent_form: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOIR_MODEL_SCHEMA", form)
    base = "http://127.0.0.1:9/v1"
    with respx.mock(assert_all_mocked=True) as mock:
        route = mock.post(f"{base}/chat/completions").mock(
            return_value=completion(json.dumps({"result": "FAIL", "why": "1 failed"})))
        reply, _, fault = asyncio.run(ask_json(
            "openai/smollm2", [{"role": "user", "content": "did it pass?"}], _Verdict,
            deadline_s=20, reply_max=2000, api_base=base))
    assert reply is not None, fault
    sent = json.loads(route.calls[0].request.content)
    assert sent["response_format"] == sent_form
    assert sent["max_tokens"] == 564


def test_an_unknown_schema_form_is_a_configuration_error_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOIR_MODEL_SCHEMA", "json-schema")
    with pytest.raises(ConfigError, match="CHOIR_MODEL_SCHEMA='json-schema'") as err:
        schema_form()
    assert "json_object_schema" in (err.value.hint or "")
    (tmp_path / "choir.yaml").write_text(
        "verifiers:\n  unit: {kind: unit_tests, steps: [{name: t, command: 'true'}]}\n"
        "models: {reporter: openai/smollm2}\n")
    with pytest.raises(ConfigError, match="CHOIR_MODEL_SCHEMA"):
        load_repo_config(tmp_path)
    proc = forked.run([sys.executable, "-m", "choir", "verify", "--repo", str(tmp_path)],
                      capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "CHOIR_MODEL_SCHEMA='json-schema' is not a schema form" in proc.stderr
    # without a structured-reply role nothing reads it
    (tmp_path / "choir.yaml").write_text(
        "verifiers:\n  unit: {kind: unit_tests, steps: [{name: t, command: 'true'}]}\n")
    load_repo_config(tmp_path)


def test_the_schema_on_the_wire_has_no_length_bounds_a_grammar_would_unroll() -> None:
    class _Odd(BaseModel):
        summary: str = Field(max_length=4000)
        maxLength: int = Field(default=3, json_schema_extra={"examples": [{"maxLength": 1}]})

    wire = _wire_schema(_Odd.model_json_schema())
    assert "maxLength" not in wire["properties"]["summary"]
    assert set(wire["properties"]) == {"summary", "maxLength"}  # a field by that name stays
    assert wire["properties"]["maxLength"]["examples"] == [{"maxLength": 1}]  # data stays
    assert _Odd.model_json_schema()["properties"]["summary"]["maxLength"] == 4000


def test_a_reply_with_raw_newlines_in_its_strings_is_read_and_nan_is_not() -> None:
    # what llama-cpp-python's grammar lets SmolLM2 write (strict JSON refuses it)
    assert parse_reply('{"why": "line one\nline two"}') == {"why": "line one\nline two"}
    for bad in ('{"confidence": NaN}', '{"confidence": Infinity}', "not json"):
        with pytest.raises(ValueError):
            parse_reply(bad)
