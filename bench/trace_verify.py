"""`choir trace verify` on a trace of N events (target: 10,000 in <= 2 s here).

    python bench/trace_verify.py [--n 10000]

The trace has the shape of a long ``choir run``: N/4 verifier calls, each a call and its
result, a plan entry and an attestation; every result has a stored log of 40 lines and a
report claim citing a span of it, so the time includes reading, validating, re-hashing every
evidence file and every cited span from the artifact store. Timed: parse + all checks, the
same function the CLI calls.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any


def build(n_events: int, store: Any) -> dict[str, Any]:
    """A well-formed trace of ``n_events`` events whose evidence lives in ``store``."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    events: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    evidence: list[dict[str, Any]] = []
    planned: list[dict[str, Any]] = []

    def event(kind: str, **fields: Any) -> int:
        seq = len(events) + 1
        events.append({"seq": seq, "kind": kind, "ts": (start + timedelta(
            milliseconds=seq)).isoformat(), **fields})
        return seq

    event("run_started", name="bench", data={"work_item": "bench", "required": ["unit"]})
    event("plan", data={"plan": 1})
    k = 0
    while len(events) < n_events - 1:
        call = f"bench-r0-unit-{k}"
        log = b"".join(b"line %d of run %d: PASSED test_%d\n" % (i, k, i) for i in range(40))
        digest = store.ingest_bytes(log)
        planned.append({"plan": 1, "name": "unit", "replica": k, "lens": "default"})
        event("tool_call", call_id=call, name="unit", data={"plan": 1, "replica": k})
        seq = event("tool_result", call_id=call, name="unit",
                    data={"result": "PASS", "report_hash": None})
        evidence.append({"hash": digest, "role": "log", "name": f"{call}/logs/combined.log"})
        claims.append({"id": f"{call}/summary", "kind": "report_summary", "event_seq": seq,
                       "text": "every step exited 0 [@1]",
                       "citations": [{"artifact": digest, "line_start": 3, "line_end": 7,
                                      "span_hash": store.span_hash(digest, 3, 7)}]})
        k += 1
    event("run_ended", data={"status": "asserted"})
    return {"schema_version": 1, "type": "choir.trace/v1", "run_id": "bench", "source": "run",
            "work_item": "bench", "plan": {"schema_version": 1, "required": ["unit"],
                                           "planned": planned},
            "events": events, "claims": claims, "evidence": evidence,
            "outcome": {"status": "asserted"}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    n = parser.parse_args().n
    from choir.evidence.artifacts import ArtifactStore
    from choir.trace.verify import verify_trace_file

    root = Path(tempfile.mkdtemp())
    try:
        store = ArtifactStore(root / "artifacts")
        path = root / "trace.json"
        path.write_text(json.dumps(build(n, store)))
        started = time.perf_counter()
        result = verify_trace_file(path, store)
        seconds = time.perf_counter() - started
        assert result.ok, result.failures[:3]
        print(f"trace verify: {result.summary_metrics['events']} events, "
              f"{result.summary_metrics['evidence_files']} evidence files, "
              f"{path.stat().st_size / 1e6:.1f} MB: {seconds:.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
