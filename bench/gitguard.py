"""The git guard's cost per sandboxed executor round: ``save`` before it, ``restore`` after.

    python bench/gitguard.py [--files 1000,7000,50000] [--venv 2700] [--runs 9]

For each size, a git repo of that many committed files (100 to a folder) and a ``.venv``
of ``--venv`` entries (read-only to the executor, so not walked: passed as ``skip``), then,
alternating, ``runs`` times each: one ``gitguard.save`` + ``restore`` pair with nothing
planted (the common round), and the bare equivalent a user's shell prompt pays for the
same tree, ``git status --porcelain`` (untracked cache off, as git's default). Prints the
medians and their ratio. Since review 25's second part the guard walks the work tree
twice (every ``.git`` below the repo's own is guarded or removed), so its cost grows with
the tree, not with ``.git``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from choir.executors import gitguard  # noqa: E402


def make(root: Path, files: int, venv: int) -> Path:
    repo = root / f"repo{files}"
    for i in range(files):
        folder = repo / f"pkg{i // 100:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"m{i % 100:03d}.py").write_text(f"x = {i}\n")
    for i in range(venv):
        folder = repo / ".venv" / "lib" / f"d{i // 50:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i % 50}.py").write_text("")
    (repo / ".gitignore").write_text(".venv/\n")
    git = ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b", "-c",
           "gc.auto=0", "-c", "maintenance.auto=false"]  # no gc racing the guard
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "bench"], check=True)
    return repo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", default="1000,7000,50000")
    ap.add_argument("--venv", type=int, default=2700)
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="choir-bench-gitguard-"))
    try:
        print(f"{'files':>7} {'guard ms':>9} {'git status ms':>14} {'ratio':>6}")
        for files in (int(n) for n in args.files.split(",")):
            repo = make(root, files, args.venv)
            skip = [repo / ".venv"]
            guard, status = [], []
            for _ in range(args.runs):
                start = time.perf_counter()
                undone = gitguard.restore(gitguard.save(repo, skip=skip))
                guard.append(time.perf_counter() - start)
                assert undone == [], undone
                start = time.perf_counter()
                subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], check=True,
                               stdout=subprocess.DEVNULL)
                status.append(time.perf_counter() - start)
            g, s = statistics.median(guard) * 1000, statistics.median(status) * 1000
            print(f"{files:>7} {g:>9.1f} {s:>14.1f} {g / s:>6.2f}")
            shutil.rmtree(repo)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    os.sync()


if __name__ == "__main__":
    main()
