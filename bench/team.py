"""Teams: what a plan item's worktree costs, against bare ``git worktree add``.

    python bench/team.py [--files 2000] [--runs 10]

Each item gets a fresh worktree from the integration head; the driver's call (prune, then
add with ``-B``, through the hardened git wrapper) is timed against the bare git command on
the same repo, as a median of ``--runs``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from choir.evidence.git import locate


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repo(Path(tmp), args.files)
        git = locate(repo)
        assert git is not None
        bare, ours = [], []
        for n in range(args.runs):
            path = Path(tmp) / f"bare{n}"
            t = time.perf_counter()
            subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "-b", f"b{n}",
                            str(path), "main"], check=True)
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            git.add_worktree(Path(tmp) / f"ours{n}", f"choir/bench/{n}", "main")
            ours.append(time.perf_counter() - t)
        b, o = statistics.median(bare), statistics.median(ours)
        print(f"worktree for {args.files} files: bare git {b * 1000:.1f} ms, "
              f"driver {o * 1000:.1f} ms ({o / b:.2f}x)")


if __name__ == "__main__":
    main()
