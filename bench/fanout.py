"""Green-thread fan-out and orchestration overhead, through the real loop (`choir run`).

    python bench/fanout.py

1. N verifiers of `sleep 1` in one round (max_parallel = N): wall time of the whole run against
   the 1 s a single verifier needs; target: within 1.5 s plus start-up.
2. The same round with `true`: everything but sandbox time, per verifier; target < 50 ms.
3. Time to resume: a finished run from its checkpoint, and a run SIGKILLed right after its
   attestations were minted (``CHOIR_FAILPOINT=attest:minted``), until it is ASSERTed.

The quick rounds are the median of three runs each.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make(root: Path, n: int, command: str, sandbox: str) -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    lines = [f"sandbox: {{backend: {sandbox}}}", f"max_parallel: {n}", "verifiers:"]
    for i in range(n):
        lines += [
            f"  v{i}:",
            "    kind: unit_tests",
            f"    steps: [{{name: s, command: {command!r}}}]",
        ]
    lines.append(f"moods: {{CALM: {{verifiers: [{', '.join(f'v{i}' for i in range(n))}]}}}}")
    (repo / "choir.yaml").write_text("\n".join(lines) + "\n")
    item = root / "item.yaml"
    item.write_text(
        "id: bench\ngoal: g\nrepo: ./repo\nexecutor: {kind: command, command: 'true'}\n"
    )
    return item


async def timed_run(item: Path, run_id: str) -> float:
    from choir.graph.runner import run_work_item

    start = time.perf_counter()
    out = await run_work_item(item, run_id=run_id)
    assert out.status == "asserted", out
    return time.perf_counter() - start


def main() -> None:
    # the repos sit beside CHOIR_HOME, never inside it: an executor may not see Choir's
    # keys or stores, and Choir refuses such a repo
    work = Path(tempfile.mkdtemp(prefix="choir-bench-fanout-"))
    home = work / "repos"
    os.environ["CHOIR_HOME"] = str(work / "home")
    os.environ["CHOIR_ARTIFACT_DIR"] = str(work / "home" / "artifacts")
    try:
        _bench(home)
    finally:
        for dirpath, _dirs, _names in os.walk(work):
            os.chmod(dirpath, 0o755)  # sealed snapshots and run folders are read-only
        shutil.rmtree(work, ignore_errors=True)


def _bench(home: Path) -> None:
    import choir.graph.orchestrator  # noqa: F401 - pay langgraph's import before timing

    for sandbox in ("local", "bwrap"):
        one = asyncio.run(
            timed_run(make(home / f"{sandbox}-1", 1, "sleep 1", sandbox), f"{sandbox}-a")
        )
        eight = asyncio.run(
            timed_run(make(home / f"{sandbox}-8", 8, "sleep 1", sandbox), f"{sandbox}-b")
        )
        item1 = make(home / f"{sandbox}-t1", 1, "true", sandbox)
        item8 = make(home / f"{sandbox}-t8", 8, "true", sandbox)
        quick1 = statistics.median(
            asyncio.run(timed_run(item1, f"{sandbox}-c{k}")) for k in range(3))
        quick8 = statistics.median(
            asyncio.run(timed_run(item8, f"{sandbox}-d{k}")) for k in range(3))
        print(
            f"[{sandbox}] 1 x sleep 1: {one:.2f} s   8 x sleep 1: {eight:.2f} s   "
            f"(8 in parallel cost {eight - one:+.2f} s over one)"
        )
        print(
            f"[{sandbox}] a whole run, 1 x true: {quick1 * 1000:.0f} ms; 8 x true: "
            f"{quick8 * 1000:.0f} ms -> {(quick8 - quick1) * 1000 / 7:.0f} ms per extra verifier"
        )
    from choir.graph.runner import resume

    start = time.perf_counter()
    asyncio.run(resume("local-d0"))
    print(f"resume a finished run: {(time.perf_counter() - start) * 1000:.0f} ms")
    crashed = subprocess.run(
        [sys.executable, "-m", "choir", "run", str(make(home / "crash", 1, "true", "local")),
         "--run-id", "crash"], env=dict(os.environ, CHOIR_FAILPOINT="attest:minted"),
        capture_output=True)
    assert crashed.returncode == -9, crashed
    start = time.perf_counter()
    out = asyncio.run(resume("crash"))
    assert out.status == "asserted", out
    print(f"resume a run killed after minting, to ASSERT: "
          f"{(time.perf_counter() - start) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
