"""The warm client's JSON (``choir._core.wirejson``) is ``json``'s, without importing it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choir._core import wirejson

# what the client sends and reads: objects, arrays, strings (environment values included,
# with the lone surrogates that undecodable bytes become), integers, booleans, null
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30)


@settings(max_examples=100, deadline=None)  # no deadline: a loaded CI machine is slow
@given(VALUES)
def test_what_it_writes_json_reads_back_and_what_json_writes_it_reads(value: Any) -> None:
    written = wirejson.dumps(value)
    assert written.isascii()
    assert json.loads(written) == value
    assert wirejson.loads(json.dumps(value).encode()) == value
    assert wirejson.loads(written) == value


def test_an_environment_value_of_undecodable_bytes_travels_as_json_sends_it() -> None:
    value = {"environ": {"NAME": b"caf\xe9".decode("utf-8", "surrogateescape")}}
    assert wirejson.dumps(value) == json.dumps(value, separators=(",", ":")).encode()


@pytest.mark.parametrize("data", [b"", b"   ", b"[1,", b'{"a": 1} x', b"NaN",
                                  b'{"exit": Infinity}', b"\xff", b"{'a': 1}", b'{"a" 1}'])
def test_anything_but_one_json_value_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        wirejson.loads(data)


@pytest.mark.parametrize("value", [1.5, {1: "a"}, b"bytes", {"a": object()}])
def test_what_the_wire_does_not_carry_is_refused_not_sent(value: Any) -> None:
    with pytest.raises(TypeError):
        wirejson.dumps(value)
