"""Per-run overhead of each sandbox against a bare subprocess of the same command.

    python bench/sandbox_overhead.py [--runs 30]

Median wall time from Python, end to end, side by side in one run (these machines are noisy,
so compare ratios and differences within a run, not across runs).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from choir.models import Limits
from choir.sandbox import get_sandbox


def bench(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    tmp = Path(tempfile.mkdtemp())
    repo, out = tmp / "repo", tmp / "out"
    repo.mkdir()
    backends = ["local", "bwrap"]
    from choir.sandbox.docker import DockerSandbox

    if DockerSandbox.available():
        backends.append("docker")
    print(f"{'command':18} {'backend':8} {'median ms':>10} {'overhead ms':>12} {'vs bare':>8}")
    for command in ("true", "python3 -c pass"):
        bare = bench(lambda c=command: subprocess.run(["/bin/sh", "-c", c], check=True), runs)
        print(f"{command:18} {'bare':8} {bare:10.1f} {0:12.1f} {1:8.2f}x")
        for name in backends:
            sb = get_sandbox(name)

            def once(sb=sb, c=command) -> None:  # type: ignore[no-untyped-def]
                r = sb.exec(
                    c,
                    repo=repo,
                    out_dir=out,
                    env={},
                    timeout_s=60,
                    limits=Limits(),
                    network=False,
                    sink=lambda _: None,
                )
                assert r.exit_code == 0, r

            once()  # warm-up
            ms = bench(once, runs)
            print(f"{command:18} {name:8} {ms:10.1f} {ms - bare:12.1f} {ms / bare:8.2f}x")
            sb.close()


if __name__ == "__main__":
    main()
