"""`choir view`'s run list over N stored runs (target: 10,000 in under 300 ms), against the
bare equivalent in the same run.

    python bench/view.py [--n 10000] [--repeat 15]

The runs are written through the stores' own writers (verify session manifests, and every
fifth a `choir run` trace), then the real `choir view` is started on them and its pages are
fetched over loopback HTTP. Rows: ``bare``: reading and parsing every run folder's manifest
and every trace once, which any list of the runs must do (the viewer does it once, at
launch, before it prints its URL); ``launch``: from starting ``choir view`` to its URL;
``first page, first request``: the first request after that; ``first page, warm``,
``filtered (FAIL)`` and ``last page``: later requests (median), which list the run folder,
stat the traces and render 50 rows. Also checks that ``import choir`` does not import the
viewer or its web stack.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bare(home: Path) -> float:
    """Parse every run folder's manifest and every trace file once (what any list costs)."""
    start = time.perf_counter()
    rows = 0
    for folder in os.scandir(home / "artifacts" / "runs"):
        with open(Path(folder.path) / "manifest.json", "rb") as fh:
            rows += json.loads(fh.read()).get("kind") == "verify_session"
    for trace in os.scandir(home / "traces"):
        with open(trace.path, "rb") as fh:
            rows += bool(json.loads(fh.readline()))
    return time.perf_counter() - start


def main() -> None:
    import httpx

    from tests.viewhome import synthetic_runs, view_server

    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        t0 = time.perf_counter()
        synthetic_runs(home, home / "artifacts", args.n)
        print(f"wrote {args.n} runs in {time.perf_counter() - t0:.1f} s")
        bare_s = min(bare(home) for _ in range(3))
        t0 = time.perf_counter()
        with view_server(home) as server, httpx.Client(base_url=server.base) as client:
            launch = time.perf_counter() - t0  # until the URL: the index is built by then
            client.get(f"/?token={server.token}")
            t0 = time.perf_counter()
            first = client.get("/?page=1")
            cold = time.perf_counter() - t0
            assert f"{args.n} shown" in first.text, first.text[:500]

            def median(path: str) -> float:
                times = []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    assert client.get(path).status_code == 200
                    times.append(time.perf_counter() - t)
                return statistics.median(times)

            rows = {"bare (parse every manifest and trace once)": bare_s,
                    "launch, until the URL (index built)": launch,
                    "first page, first request": cold,
                    "first page, warm": median("/"),
                    "filtered (FAIL)": median("/?status=FAIL"),
                    "last page": median(f"/?page={args.n // 50}")}
    for name, seconds in rows.items():
        print(f"{name:45} {seconds * 1000:8.1f} ms   {seconds / bare_s:5.2f} x bare")
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, choir; print(sorted(m for m in sys.modules if "
         "m.split('.')[0] in ('starlette', 'uvicorn', 'jinja2') or m.startswith('choir.view')))"],
        capture_output=True, text=True, check=True)
    print(f"import choir loads of the viewer: {probe.stdout.strip()}")
    worst = max(rows["first page, first request"], rows["first page, warm"],
                rows["filtered (FAIL)"], rows["last page"])
    print(f"run list of {args.n}: {'OK' if worst < 0.3 else 'OVER'} (target < 300 ms)")


if __name__ == "__main__":
    main()
