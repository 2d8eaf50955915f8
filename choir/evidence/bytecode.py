"""Bytecode an executor left in the working tree: removed before the round is sealed.

A compiled file (``*.pyc``, anything under ``__pycache__/``) is loaded in place of its source
by whoever runs the tree: an unchecked-hash one whatever the source holds, a timestamp one
whose header matches the source's stat. In a folder git ignores it is outside the tree hash
and every snapshot, so the verifiers read the source while the working tree the gate opens
for runs the executor's bytecode (review 18b #4). Every compiled file the executor's attempt
made or changed (its ``ctime`` at or after the attempt began: a ``ctime`` cannot be set back)
is removed from the working tree, ignored or not, ``.git`` aside: Python makes its own again.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from choir._core import fsopen
from choir.evidence.spec import compiled_file


def remove_new_bytecode(repo: Path, since_ns: int) -> list[str]:
    """Remove every compiled file under ``repo`` whose ``ctime`` is at or after ``since_ns``
    (a regular file or a link, never followed); the paths removed, sorted."""
    removed: list[str] = []
    try:
        for entry in fsopen.walk(repo, skip=(".git",), max_depth=fsopen.MAX_DEPTH):
            mode = entry.st.st_mode
            if (stat.S_ISREG(mode) or stat.S_ISLNK(mode)) and compiled_file(entry.rel) and \
                    entry.st.st_ctime_ns >= since_ns:
                try:
                    os.unlink(entry.name, dir_fd=entry.dir_fd)
                except FileNotFoundError:
                    continue
                removed.append(entry.rel)
    except fsopen.TooDeep:
        pass  # the round's own scan refuses such a tree, saying why
    return sorted(removed)
