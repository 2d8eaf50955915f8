"""The published JSON Schema is the one the models generate, and real traces satisfy it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from choir.trace import trace_json_schema

SCHEMA = Path(__file__).parents[3] / "docs" / "trace.schema.json"


def test_the_published_schema_equals_the_generated_one() -> None:
    assert json.loads(SCHEMA.read_text()) == trace_json_schema(), (
        "regenerate: python -c 'import json; from choir.trace import trace_json_schema; "
        "print(json.dumps(trace_json_schema(), indent=2, sort_keys=True))' "
        "> docs/trace.schema.json")


def test_a_trace_validates_against_the_published_schema(small: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.validate(small, schema)
    small["schema_version"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(small, schema)
