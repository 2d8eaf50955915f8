"""A cold ``choir verify --json`` of a one-test repo: what every command without a warm
service pays before and after its step (imports, the broker, the sandbox's start, sealing).

    python bench/cold_verify.py [--runs 12] [--sandbox bwrap|local] [--base-src DIR]

Each run starts from a fresh ``CHOIR_HOME`` (as a new user's first command, and as each
test of the suite does), ``CHOIR_SERVE=off``, stderr not a terminal. With ``--base-src`` (an
older checkout's source, first on ``PYTHONPATH``) the two run interleaved, one of each per
round, and ``paired`` is the median over rounds of this checkout's figure less the base's
in the same round: a change measured side by side on a noisy machine. Prints the medians of
wall time and of CPU (user+sys of the reaped process tree; the sandboxed step's pytest is
reaped inside bubblewrap's pid namespace and is not counted under bwrap).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CALC = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
CONFIG = """verifiers:
  unit:
    kind: unit_tests
    steps:
      - name: pytest
        command: PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {python} -m pytest -q -p no:cacheprovider
    timeout_s: 120
"""


def one_run(repo: Path, home: Path, sandbox: str, pythonpath: str | None) -> tuple[float, float]:
    shutil.rmtree(home, ignore_errors=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONDONTWRITEBYTECODE", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(CHOIR_HOME=str(home), CHOIR_SERVE="off")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "choir", "verify", "--json", "--sandbox",
                           sandbox, "--repo", str(repo)], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False, cwd=repo)  # never a checkout:
    # ``-m`` puts the working directory first, before ``PYTHONPATH``'s base source
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"choir verify exited {proc.returncode}: {proc.stderr[-2000:]!r}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--base-src", type=Path, default=None)
    args = parser.parse_args()
    rows: dict[str, str | None] = {"choir": None}
    if args.base_src is not None:
        rows["choir-base"] = str(args.base_src.resolve())
    with tempfile.TemporaryDirectory(prefix="choir-cold-") as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        (repo / "calc.py").write_text(CALC)
        (repo / "test_calc.py").write_text(TEST)
        (repo / "choir.yaml").write_text(CONFIG.format(python=os.path.realpath(sys.executable)))
        os.chmod(tmp, 0o755)  # the sandbox's user reads the tree through it
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
        one_run(repo, Path(tmp) / "home", args.sandbox, None)  # warm-up: page cache, pyc
        for _ in range(args.runs):
            for name, src in rows.items():
                samples[name].append(one_run(repo, Path(tmp) / "home", args.sandbox, src))
    print(f"cold `choir verify --json`, one test, sandbox {args.sandbox}, {args.runs} rounds")
    print(f"{'row':12} {'wall ms':>8} {'cpu ms':>8} {'paired wall':>12} {'paired cpu':>11}")
    for name, got in samples.items():
        wall = statistics.median(w for w, _ in got) * 1000
        cpu = statistics.median(c for _, c in got) * 1000
        paired = ""
        if name != "choir" and "choir" in samples:
            pairs = list(zip(samples["choir"], got, strict=True))
            wall_d = statistics.median(a[0] - b[0] for a, b in pairs) * 1000
            cpu_d = statistics.median(a[1] - b[1] for a, b in pairs) * 1000
            paired = f"{wall_d:+12.0f}{cpu_d:+12.0f}"
        print(f"{name:12} {wall:8.0f} {cpu:8.0f} {paired}")
    if "choir-base" in samples:
        print("paired: this checkout less the base, median over rounds (negative: faster)")


if __name__ == "__main__":
    main()
