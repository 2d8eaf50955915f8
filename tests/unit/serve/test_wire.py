"""A request is closed and bounded: it can say only what the command line says."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from choir.serve.wire import ENV_MAX, Envelope

CONTEXT = {"version": "0.1.0", "code": "a" * 64, "cwd": "/work", "umask": 0o022,
           "environ": {"PATH": "/usr/bin", "HOME": "/root"}}


def envelope(request: dict[str, Any], **context: Any) -> Envelope:
    return Envelope.model_validate_json(json.dumps({"context": {**CONTEXT, **context},
                                                    "request": request}))


def test_what_the_command_lines_say_is_accepted() -> None:
    verify = envelope({"command": "verify", "repo": ".", "mood": "PARANOID",
                       "sandbox": "bwrap", "as_json": True, "claim": "c1", "otel": False})
    assert verify.request.command == "verify" and verify.request.mood == "PARANOID"
    run = envelope({"command": "run", "workitem": "item.yaml", "run_id": "r1"})
    assert run.request.command == "run" and run.request.resume is None


@pytest.mark.parametrize("request_, field", [
    ({"command": "verify", "network": True}, "network"),
    ({"command": "verify", "allowlist": ["x"]}, "allowlist"),
    ({"command": "verify", "policy": {}}, "policy"),
    ({"command": "run", "executor": {"kind": "command"}}, "executor"),
    ({"command": "run", "home": "/elsewhere"}, "home"),
])
def test_an_extra_field_is_refused_by_name(request_: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=f"{request_['command']}.{field}"):
        envelope(request_)


@pytest.mark.parametrize("request_", [
    {"command": "shell", "argv": ["rm", "-rf", "/"]},
    {"command": "verify", "mood": "RECKLESS"},
    {"command": "verify", "repo": "x" * 5000},
    {"command": "verify", "repo": "a\x00b"},
    {"command": "verify", "as_json": "yes"},  # strict: no coercion
    {"command": "run", "run_id": 7},
])
def test_unknown_commands_and_unbounded_values_are_refused(request_: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        envelope(request_)


@pytest.mark.parametrize("context", [
    {"umask": 0o1000}, {"code": "zz"}, {"cwd": ""},
    {"environ": {"A=B": "x"}}, {"environ": {"A": "x\x00y"}},
    {"environ": {f"V{i}": "" for i in range(ENV_MAX + 1)}},
    {"shell": "/bin/sh"},
])
def test_a_bad_context_is_refused(context: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        envelope({"command": "verify"}, **context)
