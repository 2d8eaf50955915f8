"""The trace file is hostile input: caps, bombs and wrong shapes fail closed, never crash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import UserError
from choir.trace import TRACE_CHECKS, verify_trace, verify_trace_file
from choir.trace.verify import MAX_TRACE_BYTES


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "t.json"
    path.write_bytes(data)
    return path


def test_the_small_trace_verifies(small: dict[str, Any], store: ArtifactStore) -> None:
    result = verify_trace(small, store)
    assert result.ok and [c.name for c in result.checks] == list(TRACE_CHECKS)
    assert all(c.passed for c in result.checks)


def test_a_nesting_bomb_fails_schema(tmp_path: Path, store: ArtifactStore) -> None:
    path = _write(tmp_path, b"[" * 200_000 + b"]" * 200_000)
    result = verify_trace_file(path, store)
    assert not result.ok and {f.check for f in result.failures} == {"schema"}
    assert not any(c.passed for c in result.checks if c.name not in ("version",))


def test_an_oversized_file_is_rejected_unread(tmp_path: Path, store: ArtifactStore) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_TRACE_BYTES + 10)  # sparse: costs no disk
    result = verify_trace_file(path, store)
    assert not result.ok and {f.check for f in result.failures} == {"schema"}


@pytest.mark.parametrize("value", [[], "trace", 1, None, {"schema_version": True}])
def test_wrong_shapes_fail_version(value: Any, store: ArtifactStore) -> None:
    result = verify_trace(value, store)
    assert not result.ok and {f.check for f in result.failures} == {"version"}
    assert not any(c.passed for c in result.checks)


def test_nested_event_data_fails_schema(small: dict[str, Any], store: ArtifactStore) -> None:
    small["events"][0]["data"]["x"] = {"deep": [1, [2, [3]]]}
    result = verify_trace(small, store)
    assert {f.check for f in result.failures} == {"schema"}


def test_unknown_fields_fail_schema(small: dict[str, Any], store: ArtifactStore) -> None:
    small["claims"][0]["verified_by_me"] = True
    assert {f.check for f in verify_trace(small, store).failures} == {"schema"}


def test_naive_timestamps_fail_ordering(small: dict[str, Any], store: ArtifactStore) -> None:
    small["events"][2]["ts"] = "2026-01-01T00:00:00"
    assert {f.check for f in verify_trace(small, store).failures} == {"ordering"}


def test_a_reused_call_id_fails_linkage(small: dict[str, Any], store: ArtifactStore) -> None:
    calls = [e for e in small["events"] if e["kind"] in ("tool_call", "tool_result")]
    calls[2]["call_id"] = calls[3]["call_id"] = calls[0]["call_id"]
    assert "tool_linkage" in {f.check for f in verify_trace(small, store).failures}


def test_not_json_and_missing_are_usage_errors(tmp_path: Path, store: ArtifactStore) -> None:
    with pytest.raises(UserError, match="not a JSON document"):
        verify_trace_file(_write(tmp_path, b"\xff\xfe{"), store)
    with pytest.raises(UserError, match="cannot read"):
        verify_trace_file(tmp_path / "absent.json", store)


def test_failures_are_capped(small: dict[str, Any], store: ArtifactStore) -> None:
    small["claims"] = small["claims"] * 1  # keep shape
    for claim in small["claims"]:
        claim["text"] = "[@x]" * 300
    result = verify_trace(small, store)
    assert not result.ok and len(result.failures) <= 1000
    assert result.summary_metrics["failures"] >= len(result.failures)
    assert json.dumps(result.model_dump(mode="json"))


def test_a_giant_record_line_is_refused_without_reading_it(tmp_path: Path) -> None:
    from choir.exceptions import IntegrityError
    from choir.trace.record import MAX_RECORD_LINE, read_records

    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"seq": 1}\n' + b"x" * (MAX_RECORD_LINE * 4))
    records = read_records(path)
    assert next(records) == {"seq": 1}
    with pytest.raises(IntegrityError, match=r"run.jsonl:2: .*too long"):
        next(records)


def test_a_number_longer_than_python_reads_fails_schema(tmp_path: Path,
                                                        store: ArtifactStore) -> None:
    """Review 17a: a 5,000-digit number is JSON, but ``json.loads`` raises ValueError past
    4,300 digits: ``choir trace verify`` crashed with a traceback."""
    result = verify_trace_file(_write(tmp_path, b'{"schema_version": ' + b"9" * 5000 + b"}"),
                               store)
    assert not result.ok and {f.check for f in result.failures} == {"schema"}


@pytest.mark.parametrize("digit", ["\u00b2", "\u0661", "\uff11"])
def test_a_marker_of_a_digit_that_is_not_ascii_is_malformed(small: dict[str, Any],
                                                            store: ArtifactStore,
                                                            digit: str) -> None:
    """Review 17a: ``'²'.isdigit()`` is True and ``int('²')`` raises (a traceback), and
    ``'١'`` (Arabic-Indic one) was read as marker 1."""
    claim = next(c for c in small["claims"] if c.get("citations"))
    claim["text"] = claim["text"] + f" [@{digit}]"
    result = verify_trace(small, store)
    assert any(f.check == "citation_marker" and "malformed" in f.detail
               for f in result.failures), result.failures
