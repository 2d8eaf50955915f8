"""Streaming ingest into the artifact store against `cat > file` of the same pipe.

A producer process writes N bytes (a random 1 MiB block, varied per chunk, so no two chunks
are equal) to a pipe. Side by side in the same run:

- bare: ``producer | cat > file``
- bare+fsync: ``producer | cat > file && sync file`` (the store fsyncs; this is the fair bar)
- choir: ``producer | python -c 'ArtifactStore(...).ingest_stream(stdin)'``, which reports
  its own peak RSS (``VmHWM``; ``ru_maxrss`` would include this parent's, see
  tests/memory.py) beside the RSS of the same interpreter before ingesting,
  and the time spent inside ``ingest_stream`` ("in-proc": without interpreter start-up,
  which dominates small sizes).

    python bench/artifact_ingest.py [--sizes 1M,64M,1G] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRODUCER = """
import os, sys
n = int(sys.argv[1]); block = bytearray(os.urandom(1 << 20)); out = sys.stdout.buffer
i = 0
while n > 0:
    block[:8] = i.to_bytes(8, "little"); i += 1
    k = min(n, len(block)); out.write(block[:k]); n -= k
out.flush()
"""

CONSUMER = """
import json, sys, time
from pathlib import Path
from choir.evidence.artifacts import ArtifactStore
def peak_rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
store = ArtifactStore(Path(sys.argv[1]))
before = peak_rss_kib()
start = time.perf_counter()
digest = store.ingest_stream(sys.stdin.buffer)
seconds = time.perf_counter() - start
peak = peak_rss_kib()
print(json.dumps({"digest": digest, "rss_before_kib": before, "rss_peak_kib": peak,
                  "ingest_s": seconds}))
"""


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def timed(shell: str) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(["bash", "-o", "pipefail", "-c", shell], check=True, capture_output=True)
    return time.perf_counter() - start, out.stdout.decode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1M,64M,1G", help="comma list, e.g. 1M,64M,256M")
    parser.add_argument("--runs", type=int, default=1, help="best of N runs per case")
    args = parser.parse_args()
    py = shlex.quote(sys.executable)
    print(
        f"{'size':>6} {'cat MB/s':>9} {'cat+fsync':>9} {'choir MB/s':>10} "
        f"{'in-proc':>8} {'vs cat':>7} {'vs cat+fsync':>12} {'RSS start MiB':>13} "
        f"{'RSS peak MiB':>12}"
    )
    for label in args.sizes.split(","):
        size = parse_size(label)
        producer = f"{py} -c {shlex.quote(PRODUCER)} {size}"
        best = {"cat": float("inf"), "sync": float("inf"), "choir": float("inf")}
        info: dict[str, float] = {}
        inproc = float("inf")
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(dir=Path.cwd() / "bench") as tmp:
                out = shlex.quote(f"{tmp}/cat.out")
                t, _ = timed(f"{producer} | cat > {out}")
                best["cat"] = min(best["cat"], t)
                subprocess.run(["rm", "-f", f"{tmp}/cat.out"], check=True)
                t, _ = timed(f"{producer} | cat > {out} && sync {out}")
                best["sync"] = min(best["sync"], t)
                subprocess.run(["rm", "-f", f"{tmp}/cat.out"], check=True)
                consumer = f"{py} -c {shlex.quote(CONSUMER)} {shlex.quote(tmp + '/store')}"
                t, stdout = timed(f"{producer} | {consumer}")
                best["choir"] = min(best["choir"], t)
                info = json.loads(stdout)
                inproc = min(inproc, info["ingest_s"])
        mbps = {k: size / v / 1e6 for k, v in best.items()}
        print(
            f"{label:>6} {mbps['cat']:9.0f} {mbps['sync']:9.0f} {mbps['choir']:10.0f} "
            f"{size / inproc / 1e6:8.0f} "
            f"{mbps['choir'] / mbps['cat']:6.2f}x {mbps['choir'] / mbps['sync']:11.2f}x "
            f"{info['rss_before_kib'] / 1024:13.1f} {info['rss_peak_kib'] / 1024:12.1f}"
        )


if __name__ == "__main__":
    main()
