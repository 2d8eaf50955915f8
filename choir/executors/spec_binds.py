"""The pinned spec as the executor sees it: read-only, bound over its writable repo.

Verifiers never read the executor's spec (``choir.evidence.spec``); binding the pinned paths
read-only stops the edit where it is made, so an executor learns at once that the checks are
not its to change, and nothing it leaves behind can be mistaken for them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from choir.evidence.spec import Manifest, matcher

_WILD = re.compile(r"[*?\[]")


def _could_reach(glob: str, folder: str) -> bool:
    """True when ``glob`` might match some path under ``folder`` (conservative)."""
    body = glob.strip().strip("/")
    if not glob.strip().startswith("/") and "/" not in body:
        return True  # a bare name matches at any depth
    literal = _WILD.split(body, maxsplit=1)[0]
    return literal.startswith(folder + "/") or (folder + "/").startswith(literal)


def executor_read_only(repo: Path, manifest: Manifest, may_change: Sequence[str]) -> list[Path]:
    """The pinned paths to bind read-only over the executor's writable repo.

    Whole folders where a folder glob (``tests/``) holds only pinned files no ``may_change``
    glob could reach (no new file can be made in them either); elsewhere each pinned file.
    Symlinks are never bound (a bind would follow them).
    """
    repo = repo.resolve()
    folders = [g.strip().strip("/") for g in manifest.globs if g.strip().endswith("/")]
    is_folder = matcher(f"{f}/" for f in folders if f)
    bound: list[str] = []
    for rel in sorted(manifest.files):
        if matcher(may_change)(rel) or any(rel.startswith(b + "/") for b in bound):
            continue
        parts = rel.split("/")
        top = next(("/".join(parts[:i]) for i in range(1, len(parts))
                    if is_folder("/".join(parts[:i]) + "/x")), None)
        if top is not None and not any(_could_reach(g, top) for g in may_change):
            bound.append(top)
        else:
            bound.append(rel)
    out = []
    for rel in bound:
        path = repo / rel
        if path.exists() and not path.is_symlink() and path.resolve() == path:
            out.append(path)
    return out
