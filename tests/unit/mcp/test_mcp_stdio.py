"""The stdio line bound at its edges (the transport itself: tests/integration)."""

from __future__ import annotations

import io

from choir.mcp.stdio import read_line, request_id


def test_a_line_at_the_bound_is_kept_and_one_byte_more_is_refused() -> None:
    raw = io.BufferedReader(io.BytesIO(b"a" * 10 + b"\n" + b"b" * 11 + b"\n" + b"c"))
    assert read_line(raw, 10) == (b"a" * 10 + b"\n", False)
    assert read_line(raw, 10) == (b"b" * 11, True)  # its head only; the rest is dropped
    assert read_line(raw, 10) == (b"c", False)  # a last line without newline, as the SDK
    assert read_line(raw, 10) is None


def test_a_refused_line_is_read_to_its_newline_in_bounded_pieces() -> None:
    raw = io.BufferedReader(io.BytesIO(b"x" * 1_000_000 + b"\nnext\n"), buffer_size=4096)
    line, over = read_line(raw, 100) or (b"", False)
    assert over and len(line) <= 4096
    assert read_line(raw, 100) == (b"next\n", False)


def test_the_request_id_of_a_refused_line() -> None:
    assert request_id(b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{') == 7
    assert request_id(b'  {"id": "abc", "method": "x"') == "abc"
    assert request_id(b'{"method":"x","params":{"a":"' + b"z" * 5000 + b'","id":9') is None
    assert request_id(b"not json at all") is None
