"""A request is closed and bounded: a command line of verify or run, nothing beside it."""

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


def test_a_command_line_of_verify_or_run_is_accepted() -> None:
    verify = envelope({"argv": ["verify", "--repo", ".", "--mood", "PARANOID", "--json"]})
    assert verify.request.command == "verify"
    assert verify.request.argv[1:] == ("--repo", ".", "--mood", "PARANOID", "--json")
    run = envelope({"argv": ["run", "item.yaml", "--run-id", "r1"]})
    assert run.request.command == "run"


@pytest.mark.parametrize("field", ["network", "allowlist", "policy", "home", "command"])
def test_a_field_beside_the_command_line_is_refused_by_name(field: str) -> None:
    with pytest.raises(ValidationError, match=f"request.{field}"):
        envelope({"argv": ["verify"], field: True})


@pytest.mark.parametrize("request_", [
    {"argv": ["rm", "-rf", "/"]},  # only verify and run are served
    {"argv": ["--version", "verify"]},  # the command comes first
    {"argv": ["serve", "--stop"]},
    {"argv": []},
    {"argv": ["verify", "--repo", "x" * 5000]},
    {"argv": ["verify", "--repo", "a\x00b"]},
    {"argv": ["verify", 7]},  # strict: no coercion
    {"argv": "verify"},
    {"argv": ["verify", *["--json"] * 300]},
])
def test_other_commands_and_unbounded_values_are_refused(request_: dict[str, Any]) -> None:
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
        envelope({"argv": ["verify"]}, **context)
