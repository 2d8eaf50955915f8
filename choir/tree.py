"""Identify exactly what was verified: a content hash of the working tree, and its commit.

The tree hash covers every file git would track (tracked and untracked-but-not-ignored) with
its mode and contents, so uncommitted changes change the hash. Outside git, every file under
the repo except ``.git`` and caches. Evidence is bound to this hash, so it cannot be reused
for a different tree.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import blake3

_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv"}


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            # an executor can write the repo's .git/config, and git runs core.fsmonitor
            # from it, here, outside any sandbox: never let it (tests/integration/
            # test_executor_sandbox.py::test_an_executor_cannot_plant_git_config...)
            ["git", "-c", "core.fsmonitor=false", "-C", str(repo), *args],
            capture_output=True,
            check=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode("utf-8", "surrogateescape")


def commit_sha(repo: Path) -> str | None:
    """HEAD's sha, or None outside git or before the first commit."""
    out = _git(repo, "rev-parse", "--verify", "-q", "HEAD")
    return out.strip() or None if out else None


def _files(repo: Path) -> Iterator[str]:
    listed = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed is not None and (repo / ".git").exists():
        yield from sorted({p for p in listed.split("\0") if p})
        return
    found: list[str] = []
    for root, dirs, names in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in names:
            found.append(os.path.relpath(os.path.join(root, name), repo))
    yield from sorted(found)


def tree_hash(repo: Path) -> str:
    """Hex blake3 over (path, mode, content hash) of every file in the working tree."""
    outer = blake3.blake3()
    for rel in _files(repo):
        path = repo / rel
        try:
            st = path.lstat()
        except FileNotFoundError:  # listed by git but deleted in the working tree
            continue
        if stat.S_ISLNK(st.st_mode):
            digest = blake3.blake3(os.readlink(path).encode("utf-8", "surrogateescape"))
            kind = "l"
        elif stat.S_ISREG(st.st_mode):
            digest = blake3.blake3(max_threads=1)
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
            kind = "x" if st.st_mode & 0o111 else "f"
        else:
            continue
        outer.update(f"{kind} {rel}\0".encode("utf-8", "surrogateescape"))
        outer.update(digest.digest())
    return outer.hexdigest()
