"""Citations are hostile too: their cost is bounded by the bytes they cite, not spans x lines.

A review (session 20) cited one 2,000-line artifact by thousands of distinct spans; the
verifier walked every span for every line (a 13 MB trace took 92 s, a 60 MB one >150 s).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import blake3
import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.trace import verify as verify_mod
from choir.trace import verify_trace


def _lines(n: int) -> tuple[bytes, list[int]]:
    """A file of ``n`` lines and the byte offset where each line starts (plus the end)."""
    data = b"".join(b"line %d of a log\n" % i for i in range(n))
    offsets = [0]
    for line in data.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    return data, offsets


def _trace(digest: str, cites: list[dict[str, Any]]) -> dict[str, Any]:
    ts = datetime(2026, 1, 1, tzinfo=UTC).isoformat()
    claims = [{"id": f"c{n}", "kind": "output", "event_seq": 1,
               "citations": cites[at:at + 32],
               "text": "x" + "".join(f" [@{k}]" for k in range(1, len(cites[at:at + 32]) + 1))}
              for n, at in enumerate(range(0, len(cites), 32))]
    return {"schema_version": 1, "run_id": "r", "source": "agent",
            "plan": {"schema_version": 1},
            "events": [{"seq": 1, "kind": "run_started", "ts": ts, "data": {}},
                       {"seq": 2, "kind": "run_ended", "ts": ts, "data": {"status": "x"}}],
            "claims": claims, "evidence": [{"hash": digest, "role": "agent_context"}],
            "outcome": {"status": "completed"}}


def _cite(digest: str, data: bytes, offsets: list[int], lo: int, hi: int) -> dict[str, Any]:
    span = blake3.blake3(data[offsets[lo - 1]:offsets[hi]]).hexdigest()
    return {"artifact": digest, "line_start": lo, "line_end": hi, "span_hash": span}


def test_thousands_of_long_spans_verify_fast_and_a_wrong_one_still_fails(
        store: ArtifactStore) -> None:
    data, offsets = _lines(20_000)
    digest = store.ingest_bytes(data)
    spans = [(1 + 5 * k, min(20_000, 1 + 5 * k + k % 1000)) for k in range(4_000)]
    cites = [_cite(digest, data, offsets, lo, hi) for lo, hi in spans + [(1, 20_000)]]
    cites[777]["span_hash"] = "0" * 64
    started = time.monotonic()
    result = verify_trace(_trace(digest, cites), store)
    elapsed = time.monotonic() - started
    assert [(f.check, f.where) for f in result.failures] == \
        [("citation_hash", "claims[24].citations[9]")]
    assert elapsed < 3, f"{elapsed:.1f} s for 4,000 spans of a 20,000-line file"


def test_more_distinct_spans_than_the_cap_fail_unhashed(store: ArtifactStore) -> None:
    n = 4097  # one over the cap (MAX_SPANS_PER_ARTIFACT)
    data, offsets = _lines(n)
    digest = store.ingest_bytes(data)
    cites = [_cite(digest, data, offsets, k, k) for k in range(1, n + 1)]
    started = time.monotonic()
    result = verify_trace(_trace(digest, cites), store)
    assert time.monotonic() - started < 3
    assert {f.check for f in result.failures} == {"citation_span"}
    assert "4096 distinct spans" in result.failures[0].detail


def test_cited_bytes_over_the_cap_fail_unhashed(store: ArtifactStore,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    data, offsets = _lines(200)
    digest = store.ingest_bytes(data)
    monkeypatch.setattr(verify_mod, "MAX_CITED_BYTES", 1000)
    whole = _cite(digest, data, offsets, 1, 200)  # the file itself: its hash, at no cost
    assert verify_trace(_trace(digest, [whole]), store).ok
    cites = [whole, _cite(digest, data, offsets, 2, 200)]
    result = verify_trace(_trace(digest, cites), store)
    assert [f.check for f in result.failures] == ["citation_span"]
    assert "cited bytes" in result.failures[0].detail


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
@pytest.mark.parametrize("data", [b"", b"a", b"a\n", b"\n\n\nb", b"ab\ncd\n\nlast",
                                  b"x" * 9000 + b"\n" + b"\n" * 300 + b"y" * 70])
def test_every_span_hashes_as_the_store_does(data: bytes, chunk: int, store: ArtifactStore,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk edges, empty lines, a last line without a newline, spans past the end."""
    monkeypatch.setattr(verify_mod, "_CHUNK", chunk)
    digest = store.ingest_bytes(data)
    lines = data.count(b"\n") + (not data.endswith(b"\n") and bool(data))
    top = min(lines + 2, 12)
    spans = [(lo, hi) for lo in range(1, top + 1) for hi in range(lo, top + 1)]
    spans += [(lines - 1, lines), (2, lines), (1, lines)] if lines > 2 else []
    cites = [{"artifact": digest, "line_start": lo, "line_end": hi,
              "span_hash": store.span_hash(digest, lo, hi)} for lo, hi in spans]
    result = verify_trace(_trace(digest, cites), store)
    wrong = {(f.check, f.where) for f in result.failures}
    past = {("citation_span", f"claims[{n // 32}].citations[{n % 32}]")
            for n, (_, hi) in enumerate(spans) if hi > lines}
    assert wrong == past
