"""What the gate's rollback check costs: ``check_gate`` with and without a seen-heads mark.

    python bench/gate_anchor.py [--events 300] [--samples 200]

A store with ``--events`` events and one ASSERTed work item (a real sandboxed PASS
attestation); the two gates alternate, so load on the machine falls on both alike. With the
mark the gate reads its file, checks the events since the mark (one here: the gate before
moved it up) and writes it back under a lock; the bare gate does none of that.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CHOIR_HOME"] = f"{tmp}/home"
        os.environ["CHOIR_ARTIFACT_DIR"] = f"{tmp}/home/artifacts"
        from choir.ahdb import open_ahdb
        from choir.ahdb.anchor import SeenHeads
        from choir.app.gate import check_gate
        from choir.evidence.tree import tree_hash
        from tests.evidence import attest, make_repo

        repo = make_repo(Path(tmp) / "repo")
        tree = tree_hash(repo)
        db = open_ahdb()
        for i in range(args.events):
            db.propose(claim=f"c{i}", work_item=f"w{i}", tree_hash="0" * 64,
                       required_verifiers=["unit"])
        claim = db.propose(claim="unit", work_item="wi", tree_hash=tree,
                           required_verifiers=["unit"])
        claim = db.promote(claim.id, [attest(repo, "unit", "true").id])
        db.assert_work_item("wi", tree, references=[claim.id], claim="done")
        seen = SeenHeads(Path(tmp) / "seen-heads")

        def once(marks: SeenHeads | None) -> float:
            start = time.perf_counter()
            assert check_gate("wi", tree=tree, commit=None, seen=marks).passed
            return (time.perf_counter() - start) * 1000

        bare, anchored = [], []
        for _ in range(args.samples):
            bare.append(once(None))
            anchored.append(once(seen))
        b, a = statistics.median(bare), statistics.median(anchored)
        print(f"check_gate median over {args.samples}: bare {b:.2f} ms, with the seen-heads "
              f"check {a:.2f} ms (+{a - b:.2f} ms, x{a / b:.2f}); {db.head()[0]} events")


if __name__ == "__main__":
    main()
