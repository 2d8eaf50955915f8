"""AHDB throughput on the embedded SQLite file against a local Postgres server.

    python bench/store_backends.py [--items 150] [--procs 4]

Each work item is three checked writes, each in its own transaction with its signed head:
PROPOSE, PROMOTE over a PASS attestation (fully verified: signature, report and manifest
objects), ASSERT. Rows: ``1 proc``: one process, items/s and the median ms of a promotion;
``N procs``: N processes writing at once (the exclusive write transaction serialises them),
aggregate items/s; ``gate``: median ms of ``is_asserted`` on an open store. Postgres runs
with its defaults (fsync on, synchronous_commit on) on a Unix socket, as a throwaway
cluster under a temp dir; the machine's load average is printed, since both share it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from ahdb_scale import _attestations  # noqa: E402


def _items(home: str, url: str | None, start: int, n: int, att_ids: list[str],
           trees: list[str]) -> list[float]:
    os.environ["CHOIR_HOME"] = home
    os.environ["CHOIR_ARTIFACT_DIR"] = home + "/artifacts"
    if url:
        os.environ["CHOIR_DATABASE_URL"] = url
    from choir.ahdb import open_ahdb

    db, promote_ms = open_ahdb(), []
    for i in range(start, start + n):
        k = i % len(att_ids)
        claim = db.propose(claim="unit passes", work_item=f"wi{i}", tree_hash=trees[k],
                           required_verifiers=["unit"])
        t = time.perf_counter()
        claim = db.promote(claim.id, [att_ids[k]])
        promote_ms.append((time.perf_counter() - t) * 1000)
        db.assert_work_item(f"wi{i}", trees[k], references=[claim.id], claim="done")
    return promote_ms


def _proc(args: tuple[Any, ...]) -> list[float]:
    return _items(*args)


def run(name: str, home: Path, url: str | None, items: int, procs: int) -> None:
    os.environ["CHOIR_HOME"] = str(home)
    os.environ["CHOIR_ARTIFACT_DIR"] = str(home / "artifacts")
    if url:
        os.environ["CHOIR_DATABASE_URL"] = url
    else:
        os.environ.pop("CHOIR_DATABASE_URL", None)
    from choir.ahdb import open_ahdb

    atts = _attestations(16)
    ids, trees = [a.id for a in atts], [a.body.target.tree_hash for a in atts]
    db = open_ahdb()
    t = time.perf_counter()
    ms = _items(str(home), url, 0, items, ids, trees)
    one = items / (time.perf_counter() - t)
    ctx = multiprocessing.get_context("spawn")
    t = time.perf_counter()
    with ctx.Pool(procs) as pool:
        pool.map(_proc, [(str(home), url, (p + 1) * 100_000, items, ids, trees)
                         for p in range(procs)])
    many = procs * items / (time.perf_counter() - t)
    gate = []
    for i in range(300):
        s = time.perf_counter()
        assert db.is_asserted(f"wi{i % items}", trees[(i % items) % len(trees)]) is not None
        gate.append((time.perf_counter() - s) * 1000)
    print(f"{name:<9} {one:>11.1f} {statistics.median(ms):>11.2f} {many:>15.1f} "
          f"{statistics.median(gate):>8.3f}   events={db.head()[0]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=150)
    parser.add_argument("--procs", type=int, default=4)
    args = parser.parse_args()
    from choir.ahdb.postgres import close_connections
    from choir.testing.postgres import start_server

    base = Path(tempfile.mkdtemp(prefix="choir-bench-"))
    try:
        print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"{'store':<9} {'1 proc it/s':>11} {'promote ms':>11} "
              f"{f'{args.procs} procs it/s':>15} {'gate ms':>8}")
        run("sqlite", base / "sqlite-home", None, args.items, args.procs)
        server = start_server(base / "pg", durable=True)
        try:
            url = server.create_database("bench")
            run("postgres", base / "pg-home", url, args.items, args.procs)
            close_connections()
        finally:
            server.stop()
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
