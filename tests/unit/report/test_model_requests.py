"""What every structured model call asks of the server: bounded output, and the reply's own
schema where the server can hold the model to it (plain JSON mode elsewhere)."""

from __future__ import annotations

import asyncio
import json

import pytest
import respx
from pydantic import BaseModel

from choir.llm import ask_json, reply_tokens
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
