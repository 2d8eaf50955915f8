"""Teams: what a plan costs against the same work in series, and what the driver adds.

    python bench/team.py [--files 2000] [--runs 7] [--skip-plans]

1. A worktree for a ``--files`` repo: the driver's ``add_worktree`` (through the hardened
   git helper) against bare ``git worktree add`` on the same repo, medians of ``--runs``.
2. 8 independent items on 4 members (``max_parallel: 4``) against 2 items in series (a
   dependency chain, ``max_parallel: 1``), each item a real run: a scripted member in bwrap,
   a pytest verifier in bwrap, signed attestations, a gated merge and a verified
   integration round. The target: at most 1.3x.
3. The driver's own cost per item: the series plan's wall time less the time spent inside
   the items' runs and integration rounds (recorded per item), divided by its items.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from choir.evidence.git import locate  # noqa: E402


def _repo(root: Path, files: int) -> Path:
    repo = root / "repo"
    for i in range(files):
        sub = repo / f"pkg{i % 40}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"m{i}.py").write_text(f"X = {i}\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b",
                    "commit", "-qm", "base"], check=True)
    return repo


def worktrees(files: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repo(Path(tmp), files)
        git = locate(repo)
        assert git is not None
        bare, ours = [], []
        for n in range(runs):
            path = Path(tmp) / f"bare{n}"
            t = time.perf_counter()
            subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "-b", f"b{n}",
                            str(path), "main"], check=True)
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            git.add_worktree(Path(tmp) / f"ours{n}", f"choir/bench/{n}", "main")
            ours.append(time.perf_counter() - t)
        b, o = statistics.median(bare), statistics.median(ours)
        print(f"worktree for {files} files: bare git {b * 1000:.0f} ms, "
              f"driver {o * 1000:.0f} ms ({o / b:.2f}x)")


def _plan(root: Path, plan_id: str, n: int, chain: bool,
          parallel: int) -> dict:  # type: ignore[type-arg]
    import choir.graph.runner  # noqa: F401  (imported up front: a one-time cost, not per item)
    import choir.team.subgraph  # noqa: F401
    from choir.team.driver import run_plan
    from choir.team.plan import load_plan
    from tests.team import team_repo

    team_repo(root / "repo")
    # each member writes a file of its own name, so independent items never conflict
    members = "".join(f"  m{k}:\n    executor: {{kind: command, command: "
                      f"'echo {k} > $(mktemp -p . f{k}.XXXXXX.txt)'}}\n" for k in range(4))
    items = "".join(f"  - id: i{k}\n    goal: file {k}\n    member: m{k % 4}\n"
                    f"    max_attempts: 1\n" + (f"    depends_on: [i{k - 1}]\n"
                                                 if chain and k else "")
                    for k in range(n))
    (root / "plan.yaml").write_text(
        f"id: {plan_id}\nrepo: ./repo\nbase: main\nmax_parallel: {parallel}\n"
        f"members:\n{members}items:\n{items}")
    t = time.perf_counter()
    state = asyncio.run(run_plan(load_plan(root / "plan.yaml")))
    state["wall_s"] = time.perf_counter() - t
    assert state["status"] == "asserted", state
    return state


def plans() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CHOIR_HOME"] = str(Path(tmp) / "home")
        series = _plan(Path(tmp) / "series", "series", 2, chain=True, parallel=1)
        wide = _plan(Path(tmp) / "wide", "wide", 8, chain=False, parallel=4)
        inside = sum(r.get("run_s", 0) + r.get("integration_s", 0)
                     for r in series["items"].values())
        overhead = (series["wall_s"] - inside) / len(series["items"])
        runs = [r["run_s"] for r in wide["items"].values()]
        integ = [r["integration_s"] for r in wide["items"].values()]
        print(f"2 items in series: {series['wall_s']:.1f} s; 8 independent on 4 members: "
              f"{wide['wall_s']:.1f} s ({wide['wall_s'] / series['wall_s']:.2f}x; target "
              f"1.3x); in the 8: item runs median {statistics.median(runs):.1f} s, "
              f"integration rounds (serialised) {sum(integ):.1f} s in all")
        print(f"driver overhead per item (series plan, outside runs and integration "
              f"rounds): {overhead * 1000:.0f} ms (target 50 ms)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--skip-plans", action="store_true")
    args = ap.parse_args()
    worktrees(args.files, args.runs)
    if not args.skip_plans:
        plans()


if __name__ == "__main__":
    main()
