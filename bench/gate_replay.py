"""What answering the gate from the signed log costs (review 12, F1/F2), at 1,000 and 10,000
events.

    python bench/gate_replay.py [--sizes 1000,10000] [--samples 15]

``choir gate`` used to answer from the materialised tables (``AHDB.is_asserted``: one indexed
query); it now re-hashes the chain, finds the latest trusted signed head and replays the log
up to it through the write rules (``choir.ahdb.signed.read_signed``), then answers. The log
is built as in ``bench/ahdb_scale.py`` (propose, promote, assert per work item; 64 trees, one
PASS attestation each, so the replay verifies 64 attestations). Rows, medians of
``--samples``, alternating so load falls on all alike:

- ``tables``: the old answer, ``is_asserted`` on an open store (the bare equivalent);
- ``read_signed``: the replay alone, from the start (a fresh process);
- ``gate``: ``check_gate`` as the CLI calls it after start-up (store opened, replay from
  the start, attestations behind the ASSERT re-verified), no seen-heads mark;
- ``gate again``: ``check_gate`` in a process that gated before, after one more work item
  (3 events) was written: it replays those only (what the plan driver pays per landing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ahdb_scale import TREES, _attestations, _work_item  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--samples", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CHOIR_HOME"] = f"{tmp}/home"
        os.environ["CHOIR_ARTIFACT_DIR"] = f"{tmp}/home/artifacts"
        from choir.ahdb import open_ahdb, signed
        from choir.ahdb.signed import read_signed
        from choir.app.gate import check_gate
        from choir.attest import trust_root

        atts = _attestations(TREES)
        db = open_ahdb()
        for att in atts:
            db.record_outcome(att.id)
        trusted = trust_root().keys
        items = 0
        print(f"{'events':>7} {'tables ms':>10} {'read_signed ms':>15} {'gate ms':>8} "
              f"{'gate/tables':>12} {'gate again ms':>14}")
        for size in (int(s) for s in args.sizes.split(",")):
            while db.head()[0] < size:
                with db.batch():
                    for _ in range(min(1000, (size - db.head()[0]) // 3 + 1)):
                        _work_item(db, items, atts)
                        items += 1
            probe = items - 1
            tree = atts[probe % len(atts)].body.target.tree_hash
            rows: dict[str, list[float]] = {"tables": [], "signed": [], "gate": [],
                                            "again": []}
            for _ in range(args.samples):
                signed._memos.clear()  # a fresh process
                start = time.perf_counter()
                assert db.is_asserted(f"wi{probe}", tree) is not None
                rows["tables"].append(time.perf_counter() - start)
                start = time.perf_counter()
                assert read_signed(db, trusted).asserted(f"wi{probe}", tree) is not None
                rows["signed"].append(time.perf_counter() - start)
                signed._memos.clear()
                start = time.perf_counter()
                answer = check_gate(f"wi{probe}", tree=tree, commit=None)
                rows["gate"].append(time.perf_counter() - start)
                assert answer.passed, answer.problems
                _work_item(db, items, atts)  # 3 events, each signed
                items += 1
                start = time.perf_counter()
                answer = check_gate(f"wi{probe}", tree=tree, commit=None)
                rows["again"].append(time.perf_counter() - start)
                assert answer.passed, answer.problems
            ms = {k: statistics.median(v) * 1000 for k, v in rows.items()}
            print(f"{db.head()[0]:>7} {ms['tables']:>10.2f} {ms['signed']:>15.1f} "
                  f"{ms['gate']:>8.1f} {ms['gate'] / ms['tables']:>11.0f}x "
                  f"{ms['again']:>14.1f}", flush=True)


if __name__ == "__main__":
    main()
