"""What the bytecode from Choir's cache saves a step (``sandbox.rewritten``): pytest's rewritten
test modules, and the plain modules' compiled code.

    python bench/rewritten.py [--project networkx|slugify|toolz] [--runs 5] [--collect-only]

Makes the project as ``bench/verify_vs_bare.py`` does (its sdist, a ``.venv`` with pytest),
fills the cache the way a warm service's worker does (``collect``, a step's ``for_step``,
``fill``) and then runs the pytest preset's wrapper (``$CHOIR_PYTEST``) on the tree,
alternating, ``runs`` times each: without the folder (every test module rewritten and every
module compiled by the step, as on a sealed tree before), with the test modules' rewrites
alone in it, and with the whole folder (this step's, as bubblewrap binds it).
``--collect-only`` runs ``--co``: the collection, where every test module is imported and
rewritten, without the tests' own time. Prints the fill's and the folder's
cost, and the median CPU of the pytest process each way.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import verify_vs_bare  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--project", default="networkx", choices=sorted(verify_vs_bare.SDISTS))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--collect-only", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="choir-bench-rewritten-"))
    os.environ["CHOIR_HOME"] = str(tmp / "home")
    os.environ["CHOIR_ARTIFACT_DIR"] = str(tmp / "home" / "artifacts")
    from choir.sandbox import rewritten
    from choir.sandbox.base import pytest_source

    try:
        repo = verify_vs_bare.make_sdist(tmp, args.project)
        verify_vs_bare.prepare(repo, "bwrap", verify_vs_bare.SDISTS[args.project][2])
        tree = repo.resolve()
        extra = ["--co"] if args.collect_only else []

        def step(folder: Path | None) -> float:
            env = {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1",
                   "CHOIR_PYTEST_PYC": str(folder or ""), "CHOIR_PYTEST_ROOT": str(tree)}
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([str(tree / ".venv/bin/python"), "-c", pytest_source(), "-q",
                            "-p", "no:cacheprovider", *extra], cwd=tree, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

        rewritten.collect()
        start = time.perf_counter()
        with rewritten.for_step(tree):
            pass
        noted = len(rewritten._pending)
        walk = time.perf_counter() - start
        start = time.perf_counter()
        made = rewritten.fill(limit_s=600)
        print(f"{args.project}: {noted} modules; first walk {walk * 1000:.0f} ms; "
              f"fill made {made} in {time.perf_counter() - start:.1f} s")
        without, rewrites, with_, given, left = [], [], [], [], []
        for _ in range(args.runs):
            without.append(step(None))
            start = time.perf_counter()
            with rewritten.for_step(tree) as folder:
                given.append(time.perf_counter() - start)
                with_.append(step(folder))
                if folder is not None:
                    alone = folder.with_name(folder.name + "-rewrites")
                    shutil.copytree(folder, alone, copy_function=os.link, ignore=lambda d, n: [
                        f for f in n if f.endswith(".pyc") and "-pytest-" not in f])
                    rewrites.append(step(alone))
                    shutil.rmtree(alone)
                start = time.perf_counter()
            left.append(time.perf_counter() - start)
        print(f"folder for one step: median {statistics.median(given) * 1000:.1f} ms to be "
              f"given, {statistics.median(left) * 1000:.1f} ms to be given back")
        print(f"pytest CPU without: median {statistics.median(without):.3f} s")
        for name, row in (("rewrites alone", rewrites), ("the whole folder", with_)):
            if len(row) == len(without):
                paired = [a - b for a, b in zip(row, without, strict=True)]
                print(f"pytest CPU with {name}: median {statistics.median(row):.3f} s "
                      f"(paired {statistics.median(paired) * 1000:+.0f} ms)")
        if len(rewrites) == len(with_) > 1:
            paired = sorted(a - b for a, b in zip(with_, rewrites, strict=True))
            quartiles = ", ".join(f"{q * 1000:+.0f}" for q in statistics.quantiles(paired, n=4))
            print(f"the compiled modules' share: paired {statistics.median(paired) * 1000:+.0f}"
                  f" ms (quartiles {quartiles})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
