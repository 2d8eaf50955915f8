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
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from choir._core.canonical import blake3_hex
from choir._core.errors import IntegrityError, UserError
from choir._core.paths import choir_home

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


def written_in(tree: Path, rels: Iterable[str]) -> dict[str, str]:
    """``{path: blake3}`` of ``rels`` in the sealed snapshot ``tree`` (a link's target, as
    a spec manifest hashes it; a link is never followed)."""
    from choir._core import fsopen

    found: dict[str, str] = {}
    for rel in rels:
        try:
            body = fsopen.read_bytes(tree, rel, None)
        except OSError:
            try:
                body = os.readlink(tree / rel).encode("utf-8", "surrogateescape")
            except OSError:
                continue  # gone, or not a file: nothing a pin would take
        found[rel] = blake3_hex(body)
    return found


def pinned_reader(store: Any) -> Callable[[str], bytes]:
    """The bytes of a pinned file's digest from the artifact store, checked."""
    def read(digest: str) -> bytes:
        body: bytes = store.read_bytes(digest)
        if blake3_hex(body) != digest:
            raise IntegrityError(f"pinned spec file {digest[:12]} does not hash to its name")
        return body
    return read


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
        head = _head(repo) if suspects or written else None
        vouched_head = head is not None and head not in data["heads"]
        at_head = _blobs(repo) if vouched_head else {}
        refused = [rel for rel in suspects if at_head.get(rel) != _blob_id(
            pinned[rel][0], read(pinned[rel][1]), like=at_head.get(rel))]
        if refused:
            shown = ", ".join(refused[:_SHOWN]) + (" ..." if len(refused) > _SHOWN else "")
            why = (f"run {pending[0]} stopped before Choir recorded what its executor wrote, "
                   "and these differ from HEAD" if pending else
                   "an executor wrote these (a run's round recorded them)")
            raise UserError(
                f"{repo}: {why}: {shown}. They would be pinned as the repo's own checks.\n"
                "  fix: review them; commit the ones you vouch for (git add, git commit), "
                "remove or restore the others (git checkout -- PATH), and run again"
                + ("" if at_head or vouched_head else
                   f"; a tree that is not a git repository: delete {path} once reviewed"))
        # vouched (held by a commit a person made) or gone: forgotten; pending runs whose
        # files a person has since committed or removed are over
        data["files"] = {rel: digest for rel, digest in written.items()
                         if at_head.get(rel) is None}
        data["pending"] = []
        _save(path, data)


def _head(repo: Path) -> str | None:
    from choir.evidence.git import locate

    git = locate(repo)
    if git is None:
        return None
    try:
        with git.objects() as reader:
            found = reader.head()
    except Exception:  # noqa: BLE001 - no readable HEAD vouches for nothing
        return None
    return found[0] if found else None


def _blobs(repo: Path) -> dict[str, str]:
    """``{path: "MODE OID"}`` of HEAD's tree (git's listing; checked objects are not needed:
    a blob id that matches is the hash of the very bytes pinned)."""
    from choir.evidence.git import locate

    git = locate(repo)
    out = git.run("ls-tree", "-r", "-z", "--full-tree", "HEAD") if git else None
    found: dict[str, str] = {}
    for entry in (out or b"").split(b"\0"):
        meta, _, name = entry.partition(b"\t")
        parts = meta.split()
        if len(parts) == 3 and parts[1] == b"blob":
            found[name.decode("utf-8", "surrogateescape")] = \
                f"{parts[0].decode()} {parts[2].decode()}"
    return found


def _blob_id(kind: str, body: bytes, *, like: str | None) -> str:
    """``"MODE OID"`` git would list for a file of ``kind`` and ``body`` (the object format
    of ``like``'s id: SHA-1 or SHA-256)."""
    mode = {"l": "120000", "x": "100755"}.get(kind, "100644")
    algo = hashlib.sha256 if like is not None and len(like.split()[-1]) == 64 else hashlib.sha1
    digest = algo(b"blob %d\0" % len(body) + body).hexdigest()
    return f"{mode} {digest}"
