"""Bytecode an executor left in the working tree: removed before the round is sealed.

A compiled file (``*.pyc``, anything under ``__pycache__/``) is loaded in place of its source
by whoever runs the tree: an unchecked-hash one whatever the source holds, a timestamp one
whose header matches the source's stat. In a folder git ignores it is outside the tree hash
and every snapshot, so the verifiers read the source while the working tree the gate opens
for runs the executor's bytecode (review 18b #4). Every compiled file the executor's attempt
made or changed (its ``ctime`` at or after the attempt began: a ``ctime`` cannot be set back)
is removed from the working tree, ``.git`` aside, when it is a cache (under ``__pycache__/``:
Python makes its own again) or outside the tree (ignored by git; outside git, in a folder the
scan skips). A sourceless ``.pyc`` in the tree is a module of the executor's: it stays, for
the spec to refuse (``choir.evidence.spec.compare``), the refusal the record of what it did.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from choir._core import fsopen
from choir.evidence.git import locate
from choir.evidence.scan import SKIP_DIRS, unlistable
from choir.evidence.spec import compiled_file


def remove_new_bytecode(repo: Path, since_ns: int) -> list[str]:
    """Remove every compiled file under ``repo`` outside its tree whose ``ctime`` is at or
    after ``since_ns`` (a regular file or a link, never followed); the paths removed, sorted."""
    found: list[str] = []
    try:
        for entry in fsopen.walk(repo, skip=(".git",), max_depth=fsopen.MAX_DEPTH):
            mode = entry.st.st_mode
            if (stat.S_ISREG(mode) or stat.S_ISLNK(mode)) and compiled_file(entry.rel) and \
                    entry.st.st_ctime_ns >= since_ns:
                found.append(entry.rel)
    except fsopen.TooDeep:
        pass  # the round's own scan refuses such a tree, saying why
    except fsopen.Unlistable as exc:  # a compiled file could lie in it, unseen
        raise unlistable(repo, exc) from None
    # a cache (under __pycache__/) is Python's to make again, in the tree or not; a
    # sourceless .pyc in the tree is a module, and the executor's: the spec refuses it
    caches: list[str] = []
    others: list[str] = []
    for rel in found:
        (caches if "__pycache__" in rel.split("/")[:-1] else others).append(rel)
    removed: list[str] = []
    with fsopen.DirCursor(repo) as cursor:
        for rel in [*caches, *(_outside_the_tree(repo, others) if others else ())]:
            parts = fsopen.split(rel)
            try:
                os.unlink(parts[-1], dir_fd=cursor.dir(parts[:-1]))
            except OSError:
                continue  # gone, or reached through a link: the scan reads no link either
            removed.append(rel)
    return sorted(removed)


def _outside_the_tree(repo: Path, paths: list[str]) -> list[str]:
    """Those of ``paths`` the tree's scan leaves out: git ignores them (a tracked file is
    never ignored), or outside git, a folder the scan skips holds them."""
    git = locate(repo)
    if git is None:
        return [p for p in paths if SKIP_DIRS.intersection(p.split("/")[:-1])]
    try:
        done = subprocess.run(git.argv("check-ignore", "-z", "--stdin"), cwd=git.root,
                              env=git.env(), input="\0".join(paths).encode(
                                  "utf-8", "surrogateescape") + b"\0",
                              capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode not in (0, 1):
        return []
    named = {p.decode("utf-8", "surrogateescape") for p in done.stdout.split(b"\0") if p}
    return [p for p in paths if p in named]
