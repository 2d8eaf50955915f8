"""Property: any single-byte change to a cited span or to an evidence file is caught."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from choir.evidence.artifacts import ArtifactStore
from choir.trace import verify_trace
from tests.unit.trace.conftest import build_trace


def _flip(path: Path, offset: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] = value if value != data[offset % len(data)] else value ^ 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(data))


@settings(max_examples=40, deadline=None)
@given(offset=st.integers(min_value=0), value=st.integers(min_value=0, max_value=255),
       which=st.integers(min_value=0, max_value=3))
def test_a_byte_changed_in_an_evidence_file_is_caught(offset: int, value: int,
                                                      which: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = ArtifactStore(Path(tmp))
        trace = build_trace(12, store)
        digest = trace["evidence"][which]["hash"]
        _flip(store.path_of(digest), offset, value)
        result = verify_trace(trace, store)
        assert not result.ok
        assert "evidence_integrity" in {f.check for f in result.failures}


@settings(max_examples=40, deadline=None)
@given(pick=st.integers(min_value=0), value=st.integers(min_value=0, max_value=255),
       which=st.integers(min_value=0, max_value=3))
def test_a_byte_changed_in_a_cited_span_fails_its_citation(pick: int, value: int,
                                                           which: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = ArtifactStore(Path(tmp))
        trace = build_trace(12, store)
        cite = trace["claims"][which]["citations"][0]
        path = store.path_of(cite["artifact"])
        lines = path.read_bytes().splitlines(keepends=True)
        start = sum(len(x) for x in lines[:cite["line_start"] - 1])
        size = sum(len(x) for x in lines[cite["line_start"] - 1:cite["line_end"]])
        _flip(path, start + pick % size, value)
        result = verify_trace(trace, store)
        assert not result.ok
        assert "citation_hash" in {f.check for f in result.failures}


@settings(max_examples=40, deadline=None)
@given(pick=st.integers(min_value=0), which=st.integers(min_value=0, max_value=3))
def test_a_changed_span_hash_in_the_trace_is_caught(pick: int, which: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = ArtifactStore(Path(tmp))
        trace = build_trace(12, store)
        cite = trace["claims"][which]["citations"][0]
        at = pick % 64
        old = cite["span_hash"][at]
        cite["span_hash"] = cite["span_hash"][:at] + ("a" if old != "a" else "b") + \
            cite["span_hash"][at + 1:]
        result = verify_trace(trace, store)
        assert {f.check for f in result.failures} == {"citation_hash"}
