"""Checks an executor left in a working tree: never a later run's pinned spec.

A run pins its checks from the working tree it starts on (``choir.evidence.spec.pin_spec``),
and what an executor wrote there stays when its run ends (a halted run leaves its tree for a
person to read). A check it planted and its run refused (a root ``conftest.py`` that marks
every test passed) was pinned as the repo's own by the next run of the item, and that run
was ASSERTed (review 20c). So each round records, in ``CHOIR_HOME/leftovers/`` (the
executor's sandbox masks the home), the spec files its executor added or changed (path and
blake3) and the commit HEAD named after it; a run marks the repo pending before its executor
starts, so a run stopped before its round was recorded is not forgotten.

A run starting on the repo refuses (exit 2) to pin a file an executor wrote (the same bytes
at the same path) unless a person vouched for it: HEAD holds exactly those bytes, and HEAD
is not a commit an executor left (an executor that writes ``.git`` could commit its own
file). Editing or removing the file works too. While a run is pending, every spec file that
differs from HEAD is refused alike. Deleting the record is the way out for a tree that is not
a git repository.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from choir._core.canonical import blake3_hex
from choir._core.errors import UserError
from choir._core.paths import choir_home
from choir.evidence.scan import blob_hasher

_SHOWN = 20


def _record_path(repo: Path) -> Path:
    key = blake3_hex(str(repo.resolve()).encode("utf-8", "surrogateescape"))[:32]
    return choir_home() / "leftovers" / f"{key}.json"


@contextlib.contextmanager
def _locked(repo: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The repo's record, read under an exclusive lock (written back by ``_save``)."""
    path = _record_path(repo)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        data.setdefault("repo", str(repo.resolve()))
        data.setdefault("pending", [])
        data.setdefault("files", {})
        data.setdefault("heads", [])
        yield path, data
    finally:
        os.close(fd)


def _save(path: Path, data: dict[str, Any]) -> None:
    from choir._core.fsopen import write_whole

    write_whole(path, json.dumps(data, sort_keys=True, indent=1).encode())


def begin(repo: Path, run_id: str) -> None:
    """Before ``run_id``'s executor starts on ``repo``: the repo is pending until ``record``."""
    with _locked(repo) as (path, data):
        if run_id not in data["pending"]:
            data["pending"].append(run_id)
        _save(path, data)


def record(repo: Path, run_id: str, written: Mapping[str, str]) -> None:
    """After a round: the spec files ``run_id``'s executor added or changed (``{path:
    blake3}``), and the commit HEAD names now (one an executor may have made)."""
    head = _head(repo)
    with _locked(repo) as (path, data):
        data["files"].update(written)
        if head and head not in data["heads"]:
            data["heads"].append(head)
        data["pending"] = [r for r in data["pending"] if r != run_id]
        _save(path, data)


def check(repo: Path, pinned: Mapping[str, tuple[str, str]],
          read: Callable[[str], bytes]) -> None:
    """Refuse to pin a file of ``pinned`` (``{path: (kind, blake3)}``, a spec manifest's
    files; ``read`` gives a digest's bytes) that an executor wrote.

    Raises:
        UserError: such files, named, with what to do (exit 2).
    """
    path = _record_path(repo)
    if not path.exists():
        return
    with _locked(repo) as (path, data):
        pending, written = list(data["pending"]), dict(data["files"])
        suspects = sorted(rel for rel, (_kind, digest) in pinned.items()
                          if pending or written.get(rel) == digest)
        head, at_head = _head_files(repo) if suspects or written else (None, {})
        vouched_head = head is not None and head not in data["heads"]
        if not vouched_head:
            at_head = {}
        refused = [rel for rel in suspects
                   if not _held(at_head.get(rel), pinned[rel][0], read, pinned[rel][1])]
        if refused:
            shown = ", ".join(refused[:_SHOWN]) + (" ..." if len(refused) > _SHOWN else "")
            why = (f"run {pending[0]} stopped before Choir recorded what its executor wrote, "
                   "and these differ from HEAD" if pending else
                   "an executor wrote these (a run's round recorded them)")
            raise UserError(
                f"{repo}: {why}: {shown}. They would be pinned as the repo's own checks.\n"
                "  fix: review them; commit the ones you vouch for (git add, git commit), "
                "remove or restore the others (git checkout -- PATH), and run again"
                + ("" if head is not None else
                   f"; a tree that is not a git repository: delete {path} once reviewed"))
        # vouched (held by a commit a person made) or gone: forgotten; pending runs whose
        # files a person has since committed or removed are over
        data["files"] = {rel: digest for rel, digest in written.items()
                         if at_head.get(rel) is None}
        data["pending"] = []
        _save(path, data)


def _head(repo: Path) -> str | None:
    from choir.evidence.tree import commit_sha

    return commit_sha(repo)


def _head_files(repo: Path) -> tuple[str | None, dict[str, tuple[str, str]]]:
    """HEAD's sha and ``{path: (kind, blob id)}`` of its tree, from checked objects;
    ``(None, {})`` outside git, before a first commit, or when git cannot answer."""
    from choir.evidence.git import locate

    git = locate(repo)
    if git is None:
        return None, {}
    try:
        with git.objects() as reader:
            found = reader.head()
            if found is None:
                return None, {}
            return found[0], {p: (kind, oid) for p, kind, oid in reader.files(found[1])}
    except Exception:  # noqa: BLE001 - an unreadable HEAD vouches for nothing
        return None, {}


def _held(entry: tuple[str, str] | None, kind: str, read: Callable[[str], bytes],
          digest: str) -> bool:
    """Whether HEAD's ``entry`` (kind, blob id) is the pinned file of ``kind`` and
    ``digest``: the same kind, and git's id of its bytes."""
    if entry is None or entry[0] != kind:
        return False
    body = read(digest)
    hasher = blob_hasher(len(entry[1]), len(body))
    hasher.update(body)
    return hasher.hexdigest() == entry[1]
