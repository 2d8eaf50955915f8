"""The tree scan and snapshot (on every round's path) against bare git + copy, same run.

A git repo of N files (default 2,000 of ~10 KB in 40 folders, committed) is measured,
interleaved, median of R runs each:

- bare scan: ``git ls-files`` plus reading every listed file by path (no hashing);
- choir scan: ``inspect_tree`` (hash every file through ``choir._core.fsopen``, and the
  clean-commit check through ``choir.evidence.git``);
- bare snapshot: ``git ls-files`` plus ``shutil.copyfile`` of every listed file;
- choir snapshot: ``snapshot`` (hash, copy, seal) then ``remove_snapshot``;
- with ``--against REV``: the same two calls of ``choir/evidence/tree.py`` as it was at REV
  (loaded from git), for a before/after in the same run.

    python bench/tree_scan.py [--files 2000] [--runs 7] [--against 0cc07a6]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from choir.evidence import tree


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (git): steadier than wall time
    on a loaded machine."""
    me, kids = os.times(), os.times()
    return me.user + me.system + kids.children_user + kids.children_system


def make_repo(root: Path, files: int) -> Path:
    repo = root / "repo"
    for n in range(files):
        path = repo / f"pkg{n % 40:02d}" / f"mod{n:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# module {n}\n" + "x = 1  # padding\n" * 600)
    git = ["git", "-C", str(repo), "-c", "user.email=b@b", "-c", "user.name=b"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "bench"], check=True)
    return repo


def listed(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True,
                         check=True).stdout.decode()
    return [p for p in out.split("\0") if p]


def bare_scan(repo: Path) -> None:
    for rel in listed(repo):
        (repo / rel).read_bytes()


def bare_copy(repo: Path, dest: Path) -> None:
    for rel in listed(repo):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(repo / rel, dest / rel)
    shutil.rmtree(dest)


def load_old(rev: str) -> ModuleType:
    here = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "-C", str(here), "show", f"{rev}:choir/evidence/tree.py"],
                            capture_output=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_tree.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("old_tree", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_tree"] = module
    spec.loader.exec_module(module)
    return module


def snap(module: ModuleType, repo: Path, root: Path) -> None:
    made = module.snapshot(repo, root)
    module.remove_snapshot(made.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--against", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        repo = make_repo(tmp, args.files)
        cases: dict[str, Callable[[], object]] = {
            "bare scan (ls-files + read)": lambda: bare_scan(repo),
            "choir scan (inspect_tree)": lambda: tree.inspect_tree(repo),
            "bare snapshot (ls-files + copyfile)": lambda: bare_copy(repo, tmp / "bare"),
            "choir snapshot (+ remove)": lambda: snap(tree, repo, tmp / "snaps"),
        }
        if args.against:
            old = load_old(args.against)
            cases[f"{args.against} scan"] = lambda: old.inspect_tree(repo)
            cases[f"{args.against} snapshot (+ remove)"] = lambda: snap(old, repo, tmp / "old")
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, call in cases.items():
                start, used = time.perf_counter(), _cpu()
                call()
                times[name].append(time.perf_counter() - start)
                cpu[name].append(_cpu() - used)
        for name, values in times.items():
            print(f"{name:42s} wall median {statistics.median(values) * 1000:7.1f} ms "
                  f"(min {min(values) * 1000:7.1f})  cpu median "
                  f"{statistics.median(cpu[name]) * 1000:7.1f} ms")
        for root, _dirs, _files in os.walk(tmp):
            os.chmod(root, 0o755)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
