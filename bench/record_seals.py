"""What sealing a run's trace costs: one node's events written and sealed, against written only.

    python bench/record_seals.py [--nodes 2000] [--events 2]

A node of ``choir run`` records one to a few events; the recorder then signs the chain head
(ed25519, in process) and appends the seal line. Timed: ``TraceRecorder.emit`` for each
event and the commit, per node, with the seal and with the seal step removed (the bare
equivalent: the same events validated, chained and appended in one write). Also the cost of
checking every seal of the finished record (``check_seals``), per event.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def _record(home: Path, run_id: str, nodes: int, events: int, seal: bool) -> float:
    from choir.attest import Signer
    from choir.trace.record import TraceRecorder

    rec = TraceRecorder(run_id, home, signer=Signer.generate())
    if not seal:  # the bare equivalent: write the batch, skip the signature and its line
        def commit(node: bool = False) -> None:
            if rec._batch:
                rec._append(b"".join(rec._batch))
                rec._batch = []

        rec._commit = commit  # type: ignore[method-assign]
    start = time.perf_counter()
    for n in range(nodes):
        for k in range(events):
            rec.emit("tool_call" if k % 2 == 0 else "tool_result", name="unit",
                     call_id=f"c{n}", data={"plan": 1, "result": "PASS"})
        rec._commit(node=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--events", type=int, default=2)
    args = parser.parse_args()
    from choir.trace.chain import check_seals
    from choir.trace.record import read_trace, record_path

    home = Path(tempfile.mkdtemp(prefix="choir-bench-seals-"))
    try:
        bare = _record(home, "bare", args.nodes, args.events, seal=False)
        sealed = _record(home, "sealed", args.nodes, args.events, seal=True)
        events, seals = read_trace(record_path("sealed", home))
        keys = {seals[0].key_id}
        start = time.perf_counter()
        assert not check_seals("sealed", events, seals, keys)
        check = time.perf_counter() - start
    finally:
        shutil.rmtree(home)
    per = 1e6 / args.nodes
    print(f"{args.nodes} nodes x {args.events} events: bare {bare * per:.0f} us/node, "
          f"sealed {sealed * per:.0f} us/node ({sealed / bare:.2f}x, "
          f"+{(sealed - bare) * per:.0f} us per seal)")
    print(f"checking {len(seals)} seals over {len(events)} events: "
          f"{check * 1e6 / len(events):.1f} us/event")


if __name__ == "__main__":
    main()
