"""A run's start once an executor's commit is recorded: ``leftovers.check`` on a repo of N
pinned test files and one recorded executor commit that changed none of them.

    python bench/leftovers_check.py [--files 1000] [--runs 3]

Before the paths a recorded commit changed were worked out, every pinned file's history
was walked (one ``git rev-list`` each); now only the pinned files such a commit changed.
Prints the median time of ``check`` and the number of per-file walks it made.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from choir._core.canonical import blake3_hex
from choir.evidence import leftovers
from choir.evidence.git import GitRepo


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        for i in range(args.files):
            path = repo / "tests" / f"t{i // 100}" / f"test_{i}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"def test_{i}(): pass\n")
        _git(repo, "init", "-q")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", "a person's tests")
        leftovers.begin(repo, "r1")
        (repo / "README").write_text("the executor's\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", "the executor's")
        leftovers.record(repo, "r1", {})
        pinned = {p.relative_to(repo).as_posix(): ("f", blake3_hex(p.read_bytes()))
                  for p in repo.rglob("test_*.py")}
        bodies = {digest: (repo / rel).read_bytes() for rel, (_k, digest) in pinned.items()}
        walks = 0
        real = GitRepo.run

        def counted(self: GitRepo, *a: str, timeout: float = 60) -> bytes | None:
            nonlocal walks
            walks += "rev-list" in a and "-1" in a
            return real(self, *a, timeout=timeout)

        GitRepo.run = counted  # type: ignore[method-assign]
        times = []
        for _ in range(args.runs):
            walks = 0
            start = time.perf_counter()
            leftovers.check(repo, pinned, bodies.__getitem__)
            times.append(time.perf_counter() - start)
        print(f"{args.files} pinned files, one executor commit: check "
              f"{statistics.median(times) * 1000:.1f} ms (median of {args.runs}), "
              f"{walks} per-file walks")


if __name__ == "__main__":
    main()
