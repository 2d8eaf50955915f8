"""A trusted stat cache: a tree hash that re-reads only the files whose metadata changed.

Hashing re-read the whole tree every round (Django's 6,809 files: 0.2 s of a round that
changed one file). Like git's index, the cache keeps, per path, the ``lstat`` the file had
when its bytes were hashed (device, inode, size, mtime, ctime, mode, all to the nanosecond)
and what hashing found (kind, blake3, sha256, git blob id). A file whose ``lstat`` is
exactly the recorded one is taken from the cache; any other is opened and read.

What the cache can see: every write, truncate, rename over, replacement by another inode,
chmod, and a ``touch -d`` that restores mtime and size after a same-size rewrite, because
each of those sets ctime to the current time and no call lets a process set ctime back.
What it cannot see (docs/security.md, "Incremental snapshots"): a change that leaves all
six fields as they were, which takes a change within the granularity of the file system's
clock after the ``lstat`` (the racy case below), writes through a shared mapping that keep
the same dirty page (a process that outlives the round), moving the system clock or writing
the block device (root), file systems whose timestamps come from another machine's clock,
or an edit of this cache by a process with the caller's uid outside any sandbox. In every
case the snapshot still holds exactly the bytes the tree hash names (the cached digest's
sealed object, never the live file), so a blind spot can make Choir verify the previous
content, never attest bytes it did not verify; and PARANOID, ``choir gate`` and the hashes
``choir audit`` compares re-read every file.

Git's racy rule: a file changed in the same clock tick as the ``lstat`` that recorded it
keeps the same ``lstat``. So an entry is kept only when its mtime and ctime are older than
the scan's start by ``RACY_NS`` (two seconds: a kernel tick, and the two-second timestamps
of FAT); a younger one is re-read next time too. The cache lives in Choir's store
(``$CHOIR_ARTIFACT_DIR/trees/stat``), which executors and steps cannot see, and its rows are
never code (``choir.evidence._table``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import NamedTuple, cast

import blake3

from choir.evidence import _table

RACY_NS = 2_000_000_000
STAT_MAX = 64
# dev, ino, size, mtime_ns, ctime_ns, mode; kind; blake3, sha256, git blob id (20 or 32)
_FMT = "<QQqqqQc32s32s32s"
_Row = tuple[int, int, int, int, int, int, bytes, bytes, bytes, bytes]


class Hashed(NamedTuple):
    """What reading one file found: its kind (``f``, ``x``, ``l``), blake3 and sha256
    digests, git blob id and size."""

    kind: str
    digest: bytes
    sha256: bytes
    blob: bytes
    size: int


def stamp(st: os.stat_result) -> tuple[int, int, int, int, int, int]:
    """The six ``lstat`` fields an entry is trusted by."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def repo_key(repo: Path) -> str:
    """The cache's name for work tree ``repo``: its real path and the folder's inode (a repo
    deleted and made again at the same path starts from nothing)."""
    st = os.stat(repo)
    return blake3.blake3(f"{os.path.realpath(repo)}\0{st.st_dev}\0{st.st_ino}".encode(
        "utf-8", "surrogateescape")).hexdigest()[:32]


class StatCache:
    """The cache of one work tree for one scan: ``hit`` on the way, ``keep`` each file
    hashed, ``save`` at the end (only the rows that changed)."""

    def __init__(self, path: Path | None, oid_len: int) -> None:
        self._oid_len = oid_len
        self._table = _table.Table(path, _FMT, {"oid_len": oid_len}) if path else None
        self._old = cast(dict[str, _Row], self._table.rows if self._table else {})
        self._seen: set[str] = set()
        self._new: dict[str, _Row] = {}
        self.started = time.time_ns()

    def __bool__(self) -> bool:
        """False when the cache holds nothing (a first scan: no ``lstat`` worth taking
        ahead of the reads)."""
        return bool(self._old)

    @classmethod
    def of(cls, store: Path, repo: Path, oid_len: int) -> StatCache:
        """The cache of ``repo`` kept under the store folder ``store`` (the ``STAT_MAX``
        caches used last are kept: a plan makes a work tree per item and attempt)."""
        folder = store / "stat"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        caches = [p for p in folder.iterdir() if not p.name.startswith(".")
                  and not p.name.endswith(".delta")]
        if len(caches) > STAT_MAX:
            caches.sort(key=lambda p: p.stat().st_mtime)
            for old in caches[:len(caches) - STAT_MAX]:
                old.unlink(missing_ok=True)
                old.with_name(old.name + ".delta").unlink(missing_ok=True)
        return cls(folder / repo_key(repo), oid_len)

    def hit(self, rel: str, st: os.stat_result) -> Hashed | None:
        """The recorded hash of ``rel`` when its ``lstat`` is exactly the recorded one."""
        row = self._old.get(rel)
        if row is None or row[4] != st.st_ctime_ns or row[1] != st.st_ino or \
                row[3] != st.st_mtime_ns or row[2] != st.st_size or \
                row[5] != st.st_mode or row[0] != st.st_dev:
            return None
        self._seen.add(rel)
        return Hashed(row[6].decode(), row[7], row[8], row[9][:self._oid_len // 2],
                      st.st_size)

    def keep(self, rel: str, st: os.stat_result, hashed: Hashed) -> None:
        """Record ``rel`` as hashed from a file whose ``lstat`` (taken before reading) was
        ``st``."""
        self._seen.add(rel)
        self._new[rel] = (*stamp(st), hashed.kind.encode(), hashed.digest, hashed.sha256,
                          hashed.blob)

    def save(self) -> None:
        """Write the rows this scan changed; a path it did not see, or saw with a racy
        timestamp (see the module), loses its row."""
        if self._table is None:
            return
        limit = self.started - RACY_NS
        kept = {rel: row for rel, row in self._new.items() if row[3] < limit and row[4] < limit}
        gone = (self._old.keys() - self._seen) | (self._new.keys() - kept.keys())
        if not kept and not gone & self._old.keys():
            with contextlib.suppress(OSError):  # used: the last to be let go (STAT_MAX)
                os.utime(self._table.path)
            return
        self._table.save(cast(dict[str, tuple[object, ...]], kept), gone & self._old.keys())
