"""``choir verify --mood CALM`` against bare pytest on a real project's suite.

    python bench/verify_vs_bare.py [--runs 3] [--project toolz|slugify|networkx|generated]
                                   [--no-cold] [--sandbox bwrap] [--warm]
                                   [--tests 200] [--work-ms 50] [--base-src DIR]

Makes the project in a temp folder (git repo, its own ``.venv`` with pytest, a ``choir.yaml``
with ``unit: {uses: pytest}``), then runs, interleaved, one of each per round:

- ``bare``: ``.venv/bin/python -m pytest -q -p no:cacheprovider`` in the repo, as a user
  would (its bytecode cache warm after the warm-up round);
- ``bare-cold``: the same in a copy with no ``__pycache__`` and ``PYTHONDONTWRITEBYTECODE=1``:
  what pytest costs on a read-only tree, which is what a sandboxed verifier sees;
- ``choir``: ``choir verify --mood CALM`` (this checkout), exit 0 required;
- ``choir-base``: the same with ``--base-src`` (an older checkout's source) first on
  ``PYTHONPATH``, to measure a change before and after in one run;
- ``choir-warm`` (``--warm``): the same through a running ``choir serve`` (started with
  ``--detach`` in the bench's home, ``CHOIR_SERVE=require`` so a cold run fails instead of
  counting). Its CPU is the client's alone: the worker is the service's child. With
  ``--base-src`` too, ``choir-warm-base``: the older checkout's service, in a home of its
  own, requests interleaved with the others (a change's effect on the warm path, side by
  side on the same noisy machine).

Every command is followed by ``--settle`` seconds (0.5) before the next is timed: a warm
request's worker is replaced by a new one that arms its launchers (a dozen processes), and
without the pause that warm-up ran during whatever came next (the next round's bare pytest,
or the other service's request: a bias of 8 to 17 ms between two services of the same code).

For the ``choir`` rows the ``fixed`` column is the wall time outside the sandboxed step
(the session manifest's step durations subtracted): what Choir adds, less stretched by the
suite's own variance on a loaded machine than the difference of two medians.
Choir's own package is byte-compiled first (``compileall``), as an install does: on a
machine that sets ``PYTHONDONTWRITEBYTECODE`` globally, an editable checkout would otherwise
recompile the CLI's modules on every run, which no installed Choir does.

Prints wall and CPU seconds (user+sys of the reaped process tree) of every run, the medians
and the median ratios to ``bare``, and ``paired +ms``: the median over rounds of a row's
wall less the same round's ``bare`` (a machine that drifts during the run moves both, where
the difference of the two medians takes in the drift of each). For the ``choir`` rows the
CPU is Choir's own (its process, git, the launcher): the sandboxed pytest is reaped inside
bwrap's pid namespace and is not counted, so ``cpu`` there is the fixed overhead in CPU
seconds, which a loaded machine does not stretch the way it stretches wall time.
``--project toolz`` uses toolz 1.2.0's sdist from the pip cache (``pip download`` works
offline from it), ``slugify`` python-slugify 9.2.0's (the other suite #24 names; its tests
need ``text-unidecode``); ``generated`` writes ``--tests`` tests of about ``--work-ms``
of pure-Python work each, for a longer suite.
Nothing is left behind.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

CHOIR_YAML = """verifiers:
  unit: {{uses: pytest, timeout_s: 600}}
sandbox: {{backend: {sandbox}}}
moods:
  CALM: {{verifiers: [unit]}}
"""

GENERATED_TEST = '''import pytest


def work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


@pytest.mark.parametrize("k", range({per_file}))
def test_work(k: int) -> None:
    assert work({loops}) >= 0
'''


def sh(argv: list[str], cwd: Path, **kw: object) -> None:
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


# project: (requirement, the sdist's name prefix, what its tests import besides pytest)
SDISTS = {"toolz": ("toolz==1.2.0", "toolz", ()),
          "networkx": ("networkx==3.4.2", "networkx", ()),
          "slugify": ("python-slugify==9.2.0", "python_slugify", ("text-unidecode",))}


def make_sdist(tmp: Path, project: str) -> Path:
    """A real project from its PyPI sdist (its own tests, pure Python): toolz's suite takes
    about 1 s here, python-slugify's (140 tests, 152 subtests, 7 modules) about 0.9 s,
    networkx's (4,970 tests) about 55 s."""
    requirement, prefix, _deps = SDISTS[project]
    dl = tmp / "dl"
    sh([sys.executable, "-m", "pip", "download", "-q", requirement, "--no-deps",
        "--no-binary", ":all:", "-d", str(dl)], tmp)
    with tarfile.open(next(dl.glob(f"{prefix}-*.tar.gz"))) as tar:
        tar.extractall(tmp, filter="data")
    repo = tmp / "repo"
    next(p for p in tmp.glob(f"{prefix}-*") if p.is_dir()).rename(repo)
    return repo


def make_generated(tmp: Path, tests: int, work_ms: float) -> Path:
    repo = tmp / "repo"
    (repo / "tests").mkdir(parents=True)
    start = time.perf_counter()
    n = 0
    for i in range(200_000):
        n += i * i % 7
    per_loop = (time.perf_counter() - start) / 200_000
    loops = max(1, int(work_ms / 1000 / per_loop))
    per_file = 20
    for f in range(max(1, tests // per_file)):
        (repo / "tests" / f"test_gen_{f:03d}.py").write_text(
            GENERATED_TEST.format(per_file=per_file, loops=loops))
    (repo / "pyproject.toml").write_text('[project]\nname = "gen"\nversion = "0"\n'
                                         '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    return repo


def prepare(repo: Path, sandbox: str, deps: tuple[str, ...] = ()) -> None:
    for dirpath, dirs, files in os.walk(repo):  # an sdist's tar carries its maker's uid
        for name in (*dirs, *files):
            os.lchown(os.path.join(dirpath, name), os.getuid(), os.getgid())
    os.chmod(repo.parent, 0o755)
    (repo / ".gitignore").write_text(".venv/\n__pycache__/\n")
    (repo / "choir.yaml").write_text(CHOIR_YAML.format(sandbox=sandbox))
    sh([sys.executable, "-m", "venv", ".venv"], repo)
    sh([str(repo / ".venv/bin/python"), "-m", "pip", "install", "-q", "pytest", *deps], repo)
    sh(["git", "init", "-q"], repo)
    sh(["git", "add", "-A"], repo)
    sh(["git", "-c", "user.email=bench@choir", "-c", "user.name=bench", "commit", "-qm",
        "bench"], repo)


def cold_copy(repo: Path, tmp: Path) -> Path:
    cold = tmp / "cold"
    shutil.copytree(repo, cold, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__"),
                    symlinks=True)
    (cold / ".venv").symlink_to(repo / ".venv")
    return cold


def timed(argv: list[str], cwd: Path, env: dict[str, str], ok: tuple[int, ...] = (0,),
          ) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok:
        raise SystemExit(f"{argv[:4]} exited {proc.returncode}: "
                         f"{proc.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def step_seconds(home: Path) -> float:
    """The sandboxed steps' time in the newest ``choir verify`` session of ``home``."""
    runs = home / "artifacts" / "runs"
    newest = max((p for p in runs.glob("verify-*") if (p / "manifest.json").is_file()
                  and p.name.count("-") == 2), key=lambda p: p.stat().st_mtime_ns)
    import json

    manifest = json.loads((newest / "manifest.json").read_text())
    return sum(c["duration_ms"] for c in manifest["commands_executed"]) / 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--project", choices=[*SDISTS, "generated"], default="toolz")
    parser.add_argument("--no-cold", action="store_true",
                        help="skip the bare-cold row (a long suite: saves a run per round)")
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--work-ms", type=float, default=50.0)
    parser.add_argument("--base-src", type=Path, default=None,
                        help="an older checkout's source root, run as 'choir-base'")
    parser.add_argument("--warm", action="store_true",
                        help="add 'choir-warm': the same through a running choir serve")
    parser.add_argument("--settle", type=float, default=0.5,
                        help="seconds to wait after each command, so what it left running "
                             "(a service's next worker warming up) is not timed in the next")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="choir-bench-verify-"))
    homes = [tmp / "home"]
    try:
        repo = (make_sdist(tmp, args.project) if args.project in SDISTS
                else make_generated(tmp, args.tests, args.work_ms))
        prepare(repo, args.sandbox, SDISTS[args.project][2] if args.project in SDISTS else ())
        cold = cold_copy(repo, tmp)
        env = {k: v for k, v in os.environ.items()
               if k not in ("VIRTUAL_ENV", "PYTHONPATH", "CHOIR_ARTIFACT_DIR",
                            "AGENT_ARTIFACT_DIR", "CHOIR_SERVE")}
        env["CHOIR_HOME"] = str(tmp / "home")
        python = str(repo / ".venv/bin/python")
        pytest_argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        choir_argv = [sys.executable, "-m", "choir", "verify", "--mood", "CALM", "--repo",
                      str(repo)]
        configs = {
            "bare": (pytest_argv, repo, env),
            "bare-cold": (pytest_argv, cold, {**env, "PYTHONDONTWRITEBYTECODE": "1"}),
            "choir": (choir_argv, repo, env),
        }
        if args.no_cold:
            del configs["bare-cold"]
        if args.base_src is not None:
            configs["choir-base"] = (choir_argv, repo,
                                     {**env, "PYTHONPATH": str(args.base_src.resolve())})
        if args.warm:
            configs["choir"] = (choir_argv, repo, {**env, "CHOIR_SERVE": "off"})
            configs["choir-warm"] = (choir_argv, repo, {**env, "CHOIR_SERVE": "require"})
            subprocess.run([sys.executable, "-m", "choir", "serve", "--detach"], cwd=repo,
                           env=env, check=True, stdout=subprocess.DEVNULL)
            if args.base_src is not None:  # the older checkout's service, in a home of its own
                based = {**env, "PYTHONPATH": str(args.base_src.resolve()),
                         "CHOIR_HOME": str(tmp / "home-base")}
                configs["choir-warm-base"] = (choir_argv, repo,
                                              {**based, "CHOIR_SERVE": "require"})
                homes.append(tmp / "home-base")
                subprocess.run([sys.executable, "-m", "choir", "serve", "--detach"], cwd=repo,
                               env=based, check=True, stdout=subprocess.DEVNULL)
        import choir

        sh([sys.executable, "-m", "compileall", "-q", str(Path(choir.__file__).parent)], tmp)
        for argv, cwd, e in configs.values():
            timed(argv, cwd, e)  # warm-up: bytecode caches, the signing key, page cache
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
        fixed: dict[str, list[float]] = {name: [] for name in configs if "choir" in name}
        for round_ in range(1, args.runs + 1):
            line = []
            for name, (argv, cwd, e) in configs.items():
                wall, cpu = timed(argv, cwd, e)
                time.sleep(args.settle)
                samples[name].append((wall, cpu))
                extra = ""
                if name in fixed:
                    fixed[name].append(wall - step_seconds(Path(e["CHOIR_HOME"])))
                    extra = f" ({fixed[name][-1]:.3f}s fixed)"
                line.append(f"{name} {wall:.2f}s wall {cpu:.2f}s cpu{extra}")
            print(f"run {round_}: " + " | ".join(line), flush=True)
        bare_wall = statistics.median(w for w, _ in samples["bare"])
        bare_cpu = statistics.median(c for _, c in samples["bare"])
        print(f"project {args.project}, sandbox {args.sandbox}, {args.runs} interleaved runs")
        print(f"{'config':11} {'wall s':>7} {'cpu s':>7} {'wall ratio':>11} {'cpu ratio':>10}"
              f" {'wall +s':>8} {'cpu +s':>7} {'paired +ms':>11}")
        for name, values in samples.items():
            wall = statistics.median(w for w, _ in values)
            cpu = statistics.median(c for _, c in values)
            paired = statistics.median(w - b for (w, _), (b, _) in zip(values, samples["bare"],
                                                                        strict=True))
            print(f"{name:11} {wall:7.2f} {cpu:7.2f} {wall / bare_wall:10.2f}x "
                  f"{cpu / bare_cpu:9.2f}x {wall - bare_wall:8.2f} {cpu - bare_cpu:7.2f}"
                  f" {paired * 1000:11.0f}")
        for name, values in fixed.items():
            print(f"{name}: fixed (wall outside the sandboxed step) median "
                  f"{statistics.median(values) * 1000:.0f} ms, "
                  f"min {min(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms")
    finally:
        for served in homes if args.warm else []:
            subprocess.run([sys.executable, "-m", "choir", "serve", "--stop"],
                           env={**os.environ, "CHOIR_HOME": str(served)},
                           stdout=subprocess.DEVNULL, check=False)
        for dirpath, _dirs, _names in os.walk(tmp):
            os.chmod(dirpath, 0o755)  # sealed snapshots and run folders are read-only
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
