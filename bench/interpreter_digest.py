"""What hashing the verifiers' interpreter costs (``choir.sandbox._interpreter.measure``).

    python bench/interpreter_digest.py VENV [VENV ...]

Each VENV is hashed as an interpreter inside a repo (its whole folder: scope ``tree``):

- ``cold``: the page cache dropped first (as root), no digest cache: every byte read;
- ``uncached``: no digest cache, files in the page cache (a fresh ``CHOIR_HOME``);
- ``cached``: the per-file digest cache on disk, read by a fresh process (median of 5);
- ``bare walk``: ``os.walk`` + ``lstat`` of the same tree, the floor of any stat-based check.

Compare ``cached`` with ``bare walk`` in the same run; the machine's load moves both.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(venvs: list[str]) -> None:
    home = tempfile.mkdtemp(prefix="choir-bench-digest-")
    os.environ["CHOIR_HOME"] = home
    from choir.sandbox import _interpreter
    from choir.sandbox._toolchain import Toolchain, _from_interpreter

    try:
        for given in venvs:
            venv, base = _from_interpreter(given)
            tools = Toolchain(binds=(), path_head=(f"{venv}/bin", f"{base}/bin"), venv=venv)
            repo = Path(given).resolve().parent
            files = [os.path.join(d, f) for d, _, fs in os.walk(given) for f in fs]
            size = sum(os.lstat(f).st_size for f in files)

            def fresh(tools: Toolchain = tools, repo: Path = repo) -> float:
                _interpreter._MEMO.clear()
                shutil.rmtree(f"{home}/cache", ignore_errors=True)
                start = time.perf_counter()
                _interpreter.measure(tools, repo)
                return time.perf_counter() - start

            subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"],
                           stderr=subprocess.DEVNULL, check=False)
            cold, uncached = fresh(), fresh()
            cached, walks = [], []
            for _ in range(5):
                _interpreter._MEMO.clear()  # the on-disk cache, as a new process reads it
                start = time.perf_counter()
                _interpreter.measure(tools, repo)
                cached.append(time.perf_counter() - start)
                start = time.perf_counter()
                for folder, dirs, names in os.walk(given):
                    for name in dirs + names:
                        os.lstat(os.path.join(folder, name))
                walks.append(time.perf_counter() - start)
            c, w = statistics.median(cached), statistics.median(walks)
            print(f"{given}: {len(files)} files, {size / 2**20:.0f} MiB: cold {cold * 1e3:.0f} ms,"
                  f" uncached {uncached * 1e3:.0f} ms, cached {c * 1e3:.0f} ms, bare walk "
                  f"{w * 1e3:.0f} ms (cached/walk {c / w:.1f}x)")
    finally:
        shutil.rmtree(home)


if __name__ == "__main__":
    main(sys.argv[1:])
