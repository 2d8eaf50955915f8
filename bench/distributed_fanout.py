"""8 verifiers over 2 local Dask workers finish in about the time of the slowest.

    python bench/distributed_fanout.py [--sandbox bwrap|docker|local] [--rounds 3]

Starts a real cluster (a scheduler and two worker processes, 4 threads each, on loopback:
``choir.distributed.local_cluster``), then runs ``choir verify`` (``verify_tree``) on a repo
of 8 verifiers ``sleep N`` with N = 1.0, 1.5, ..., 4.5 s, fanned out through
``CHOIR_SCHEDULER``. Reported: cluster start-up, each round's wall time against the slowest
verifier (4.5 s), the overhead above it, and the same 8 verifiers as local green threads
(no cluster) for comparison. Every round must PASS with 8 attestations.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

SLEEPS = [1.0 + 0.5 * i for i in range(8)]


def make_repo(root: Path, sandbox: str) -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / "data.txt").write_text("bench\n")
    lines = [f"sandbox: {{backend: {sandbox}}}", "max_parallel: 8", "verifiers:"]
    for i, seconds in enumerate(SLEEPS):
        lines += [f"  sleep{i}:", "    kind: smoke",
                  f"    steps: [{{name: s, command: 'sleep {seconds}'}}]"]
    (repo / "choir.yaml").write_text("\n".join(lines) + "\n")
    return repo


def one_round(repo: Path, sandbox: str) -> float:
    from choir.app.verify import verify_tree
    from choir.models import Mood

    start = time.perf_counter()
    outcome = verify_tree(repo, mood=Mood.SKEPTICAL, sandbox_name=sandbox)
    took = time.perf_counter() - start
    assert outcome.passed and len(outcome.contract["attestations"]) == 8, outcome.contract
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="choir-bench-dist-"))
    os.environ["CHOIR_HOME"] = str(root / "home")
    os.environ["CHOIR_ARTIFACT_DIR"] = str(root / "home" / "artifacts")
    from choir.distributed.local_cluster import LocalCluster

    repo = make_repo(root, args.sandbox)
    slowest = max(SLEEPS)
    print(f"8 verifiers: sleep {', '.join(f'{s:g}' for s in SLEEPS)} s "
          f"(slowest {slowest:g} s, sum {sum(SLEEPS):g} s); sandbox {args.sandbox}")
    os.environ.pop("CHOIR_SCHEDULER", None)
    local = [one_round(repo, args.sandbox) for _ in range(args.rounds)]
    print(f"local green threads:      median {statistics.median(local):.2f} s  "
          f"(rounds: {', '.join(f'{t:.2f}' for t in local)})")
    start = time.perf_counter()
    with LocalCluster(root / "cluster", workers=2, threads=4) as cluster:
        up = time.perf_counter() - start
        print(f"cluster up (scheduler + 2 worker processes): {up:.2f} s")
        os.environ["CHOIR_SCHEDULER"] = cluster.address
        dist = [one_round(repo, args.sandbox) for _ in range(args.rounds)]
    med = statistics.median(dist)
    print(f"2 Dask workers x 4 threads: median {med:.2f} s  "
          f"(rounds: {', '.join(f'{t:.2f}' for t in dist)})")
    print(f"overhead above the slowest verifier: {med - slowest:.2f} s "
          f"({med / slowest:.2f}x the slowest; one after another would be {sum(SLEEPS):g} s)")


if __name__ == "__main__":
    main()
