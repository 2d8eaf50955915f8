"""What a round's snapshot costs as the tree grows: ``choir verify`` on big trees against a
one-file repo, side by side in one run, with the store (``choir.evidence.store``) and
without it (``CHOIR_TREE_STORE=off``: the copy every round made before).

    python bench/snapshots.py [--runs 3] [--no-django] [--no-big] [--no-curve]
                              [--big 50000] [--png docs/snapshots.png]

Every measured ``choir verify --mood CALM --sandbox bwrap`` runs one noop verifier (its one
step is ``true``) and is paired with a verify of a one-file repo just before it, so each
figure is "+s over the one-file repo under the same load" (the median of ``--runs`` pairs;
the machine is shared). Rows:

- Django 5.1.4's sdist (6,809 files, a git repo; ``pip download`` from the pip cache):
  first verify with an empty store, a second of the same tree, one after changing one file;
  the same three with the store off;
- a synthetic tree of ``--big`` files (50,000: 1,000 folders of small modules): the second
  round after a one-file change, and the peak RSS of the ``choir`` process at each size;
- the cost curve: a round after one changed file at 1,000, 7,000 and 50,000 files, and
  after 1, 100 and 1,000 changed files at 50,000; plotted to ``--png`` when matplotlib
  imports, printed as a table always;
- ``--base``: ``choir verify --base`` (the base commit's checks, read through a spec view)
  against a plain verify of the same tree, paired, on Django's tree (the synthetic 7,000
  files with ``--no-django``) after a one-file commit on top of its base: the first of a
  fresh store and a second;
- ``--worktrees``: a plan item's worktree of a 2,000-file repo, ``GitRepo.add_worktree`` in
  a process confined as ``choir plan run`` is (an overlay of the store's checkout) against
  bare ``git worktree add``: the first (its checkout built), the next ones of the same
  commit, and one of a new commit (its checkout linked from the last); medians.

Wall and CPU seconds (the reaped process tree's user+sys: the sandboxed step runs in
bwrap's pid namespace and is not counted) are both printed; CPU is what load does not
stretch. Nothing is left behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

CHOIR_YAML = """verifiers:
  noop:
    kind: pipeline
    steps:
      - name: noop
        command: "true"
sandbox: {backend: bwrap}
moods:
  CALM: {verifiers: [noop]}
"""
GIT = ["git", "-c", "user.email=bench@choir", "-c", "user.name=bench", "-c", "gc.auto=0"]


def sh(argv: list[str], cwd: Path) -> None:
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def commit(repo: Path) -> None:
    (repo / "choir.yaml").write_text(CHOIR_YAML)
    for dirpath, dirs, files in os.walk(repo):  # an sdist's tar carries its maker's uid
        for name in (*dirs, *files):
            os.lchown(os.path.join(dirpath, name), os.getuid(), os.getgid())
    sh([*GIT, "init", "-q"], repo)
    sh([*GIT, "add", "-A"], repo)
    sh([*GIT, "commit", "-qm", "bench"], repo)


def one_file(tmp: Path) -> Path:
    repo = tmp / "one"
    repo.mkdir()
    (repo / "mod.py").write_text("x = 1\n")
    commit(repo)
    return repo


def django(tmp: Path) -> Path:
    dl = tmp / "dl"
    sh([sys.executable, "-m", "pip", "download", "-q", "django==5.1.4", "--no-deps",
        "--no-binary", ":all:", "-d", str(dl)], tmp)
    with tarfile.open(next(dl.glob("[Dd]jango-*.tar.gz"))) as tar:
        tar.extractall(tmp, filter="data")
    repo = tmp / "django"
    next(tmp.glob("[Dd]jango-5*")).rename(repo)
    commit(repo)
    return repo


def synthetic(tmp: Path, files: int) -> Path:
    """``files`` small modules, 50 per folder (folders two deep), like a monorepo's."""
    repo = tmp / f"syn{files}"
    for i in range(files):
        folder = repo / f"pkg{i % 50:02d}" / f"sub{(i // 50) % (files // 2500 + 1):02d}"
        if not folder.is_dir():
            folder.mkdir(parents=True)
        (folder / f"mod{i:05d}.py").write_text(f"# module {i}\n" + "x = 1\n" * (i % 40))
    commit(repo)
    return repo


def listed(repo: Path) -> list[Path]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "*.py"],
                         capture_output=True, check=True).stdout.decode()
    return [repo / p for p in out.split("\0") if p]


def change(files: list[Path], n: int, round_: int) -> None:
    """Change ``n`` files (the same ones each round, new bytes each time)."""
    for path in files[:n]:
        with open(path, "a") as fh:
            fh.write(f"# round {round_}\n")


class Runner:
    """``choir verify`` runs, each paired with the one-file repo's just before it."""

    def __init__(self, tmp: Path, one: Path) -> None:
        self.tmp = tmp
        self.one = one
        self.base = {k: v for k, v in os.environ.items()
                     if k not in ("VIRTUAL_ENV", "PYTHONPATH", "CHOIR_ARTIFACT_DIR",
                                  "AGENT_ARTIFACT_DIR", "CHOIR_TREE_STORE")}
        self.homes = 0

    def home(self, store: bool = True) -> dict[str, str]:
        """A fresh CHOIR_HOME (an empty store)."""
        self.homes += 1
        env = {**self.base, "CHOIR_HOME": str(self.tmp / f"home{self.homes}")}
        if not store:
            env["CHOIR_TREE_STORE"] = "off"
        return env

    def verify(self, repo: Path, env: dict[str, str],
               *extra: str) -> tuple[float, float, int]:
        """(wall s, cpu s, peak RSS KiB) of one ``choir verify``."""
        argv = [sys.executable, "-m", "choir", "verify", "--mood", "CALM", "--sandbox",
                "bwrap", "--repo", str(repo), *extra]
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        assert proc.stderr is not None
        err = proc.stderr.read()
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"choir verify {repo} exited {proc.returncode}: "
                             f"{err.decode()[-2000:]}")
        return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss

    def paired(self, repo: Path, env: dict[str, str],
               one_env: dict[str, str]) -> tuple[float, float, int]:
        """(+wall s, +cpu s, peak RSS) of ``repo`` over the one-file repo, run just after."""
        one_wall, one_cpu, _ = self.verify(self.one, one_env)
        wall, cpu, rss = self.verify(repo, env)
        return wall - one_wall, cpu - one_cpu, rss


def med(rows: list[tuple[float, float, int]]) -> tuple[float, float, int]:
    return (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows),
            max(r[2] for r in rows))


def fmt(row: tuple[float, float, int]) -> str:
    return f"+{row[0]:.2f} s wall, +{row[1]:.2f} s cpu, peak RSS {row[2] / 1024:.0f} MiB"


def rounds(run: Runner, repo: Path, runs: int, store: bool,
           one_env: dict[str, str]) -> dict[str, tuple[float, float, int]]:
    """First (empty store), second (same tree), after one change: medians of ``runs``."""
    files = listed(repo)
    out: dict[str, list[tuple[float, float, int]]] = {"first": [], "second": [], "change": []}
    for n in range(runs):
        env = run.home(store)
        out["first"].append(run.paired(repo, env, one_env))
        out["second"].append(run.paired(repo, env, one_env))
        change(files, 1, n)
        out["change"].append(run.paired(repo, env, one_env))
    return {k: med(v) for k, v in out.items()}


def against_base(run: Runner, repo: Path, runs: int) -> dict[str, tuple[float, float, int]]:
    """``--base HEAD~1`` over a plain verify of the same tree (run just before, same home):
    the first of an empty store, and a second; medians of ``runs``."""
    change(listed(repo), 1, 99)
    sh([*GIT, "commit", "-qam", "one file"], repo)
    out: dict[str, list[tuple[float, float, int]]] = {"first": [], "second": []}
    for _ in range(runs):
        env = run.home()
        for name in ("first", "second"):
            wall, cpu, _ = run.verify(repo, env)
            b_wall, b_cpu, rss = run.verify(repo, env, "--base", "HEAD~1")
            out[name].append((b_wall - wall, b_cpu - cpu, rss))
    return {k: med(v) for k, v in out.items()}


def curve(run: Runner, tmp: Path, big: Path, runs: int,
          one_env: dict[str, str]) -> dict[str, tuple[float, float, int]]:
    points: dict[str, tuple[float, float, int]] = {}
    for size in (1000, 7000):
        repo = synthetic(tmp, size)
        env = run.home()
        run.verify(repo, env)
        files = listed(repo)
        rows = []
        for n in range(runs):
            change(files, 1, n)
            rows.append(run.paired(repo, env, one_env))
        points[f"size {size}"] = med(rows)
        shutil.rmtree(repo)
    env = run.home()
    run.verify(big, env)
    files = listed(big)
    for changed in (1, 100, 1000):
        rows = []
        for n in range(runs):
            change(files, changed, 100 + n)
            rows.append(run.paired(big, env, one_env))
        points[f"changed {changed}"] = med(rows)
    points[f"size {len(files)}"] = points["changed 1"]
    return points


WORKTREES = """
import os, pathlib, statistics, subprocess, sys, time
from choir.trusted import separate
assert separate() == "mount-namespace", "worktrees from the store need a root Choir"
from choir.evidence.git import locate
repo, root, runs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
git = locate(repo)
def timed(fn):
    t = time.perf_counter(); fn(); return (time.perf_counter() - t) * 1000
bare = [timed(lambda n=n: subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q",
        "-b", f"bare{n}", str(root / f"bare{n}"), "main"], check=True)) for n in range(runs)]
first = timed(lambda: git.add_worktree(root / "first", "choir/bench/first", "main"))
warm = [timed(lambda n=n: git.add_worktree(root / f"w{n}", f"choir/bench/w{n}", "main"))
        for n in range(runs)]
made = git.add_worktree(root / "item", "choir/bench/item", "main")
(made.root / "pkg0" / "m0.py").write_text("X = -1\\n")
made.write("commit", "-qam", "item")
after = timed(lambda: git.add_worktree(root / "next", "choir/bench/next", "choir/bench/item"))
print(f"bare git worktree add {statistics.median(bare):.0f} ms (median of {runs}); "
      f"add_worktree: first {first:.0f} ms (its checkout built), next ones "
      f"{statistics.median(warm):.0f} ms (median of {runs}, min {min(warm):.0f}, "
      f"max {max(warm):.0f}), a new commit's {after:.0f} ms")
"""


def worktrees(run: Runner, tmp: Path, files: int, runs: int) -> None:
    repo = tmp / "wtrepo"
    for i in range(files):
        folder = repo / f"pkg{i % 40}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"m{i}.py").write_text(f"X = {i}\n")
    sh(["git", "init", "-q", "-b", "main"], repo)
    commit(repo)
    (tmp / "wts").mkdir()
    out = subprocess.run([sys.executable, "-c", WORKTREES, str(repo), str(tmp / "wts"),
                          str(runs)], env=run.home(), capture_output=True, text=True)
    print(f"worktrees, {files} files: " + (out.stdout.strip() or out.stderr[-800:]),
          flush=True)


def plot(points: dict[str, tuple[float, float, int]], png: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sizes = sorted(int(k.split()[1]) for k in points if k.startswith("size"))
    changed = sorted(int(k.split()[1]) for k in points if k.startswith("changed"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, xs, key, label in ((left, sizes, "size", "files in the tree (1 changed)"),
                               (right, changed, "changed", "files changed (50,000-file tree)")):
        ax.plot(xs, [points[f"{key} {x}"][0] for x in xs], "o-", label="wall")
        ax.plot(xs, [points[f"{key} {x}"][1] for x in xs], "s--", label="cpu")
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("s over a one-file repo")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("choir verify, noop verifier, bwrap: a round after a change")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--big", type=int, default=50000)
    parser.add_argument("--no-django", action="store_true")
    parser.add_argument("--no-big", action="store_true")
    parser.add_argument("--no-curve", action="store_true")
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--worktrees", action="store_true")
    parser.add_argument("--base", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="choir-bench-snap-"))
    os.chmod(tmp, 0o755)
    try:
        run = Runner(tmp, one_file(tmp))
        one_env = run.home()
        for _ in range(2):
            run.verify(run.one, one_env)  # warm: the key, the launcher, bytecode caches
        print(f"load average at start: {os.getloadavg()}", flush=True)
        if args.worktrees:
            worktrees(run, tmp, 2000, max(7, args.runs))
        dj = None if args.no_django else django(tmp)
        if args.base:
            based = dj if dj is not None else synthetic(tmp, 7000)
            for name, row in against_base(run, based, args.runs).items():
                print(f"--base over plain, {based.name} {name:6}: {fmt(row)}", flush=True)
        if dj is not None:
            repo = dj
            for store in (True, False):
                found = rounds(run, repo, args.runs, store, one_env)
                for name, row in found.items():
                    print(f"django {'store' if store else 'copy '} {name:6}: {fmt(row)}",
                          flush=True)
        big = synthetic(tmp, args.big) if not (args.no_big and args.no_curve) else None
        if big is not None and not args.no_big:
            for store in (True, False):
                env = run.home(store)
                first = run.paired(big, env, one_env)
                print(f"{args.big} {'store' if store else 'copy '} first : {fmt(first)}",
                      flush=True)
                files = listed(big)
                rows = []
                for n in range(args.runs if store else 1):
                    change(files, 1, 50 + n)
                    rows.append(run.paired(big, env, one_env))
                print(f"{args.big} {'store' if store else 'copy '} change: {fmt(med(rows))}",
                      flush=True)
        if big is not None and not args.no_curve:
            points = curve(run, tmp, big, args.runs, one_env)
            print("cost curve (a round after the change, over the one-file repo):")
            for name, row in points.items():
                print(f"  {name:14} {fmt(row)}")
            if args.png is not None:
                print(f"plot: {args.png}" if plot(points, args.png)
                      else "plot: matplotlib is not installed (the table above)")
        print(f"load average at end: {os.getloadavg()}")
    finally:
        for dirpath, _dirs, _names in os.walk(tmp):
            os.chmod(dirpath, 0o755)  # sealed snapshots and stores are read-only
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
