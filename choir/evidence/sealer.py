"""A sealed tree built from the store: the sink a snapshot's scan fills
(``choir.evidence.scan``), which changes a parked tree of the pool into the new one.

Why the pool, and what holds against whom: ``choir.evidence.store``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import blake3

from choir._core import fsopen
from choir.evidence import _table, stamps
from choir.evidence.store import (
    CHUNK,
    DIR,
    MODES,
    RECORD,
    Note,
    Row,
    Store,
    bytes_match,
    rmtree,
    stamp_of,
    started_at,
)


class StaleBase(Exception):
    """A base entry the scan took as kept was written between rounds, and so was the store's
    copy of its bytes: nothing already there holds them (``Sealer.reconcile``)."""


@dataclass
class _Entry:
    """One file of the tree being built that the base does not already hold."""

    kind: str
    digest: bytes
    source: str  # new (an object linked into work/: written now, or the store's) | link
    origin: str  # the object's name in work/, or a symlink's target


@dataclass
class Sealer:
    """One sealed tree being built from the scan of a live tree (``tree.py``'s sink).

    Made before the scan: it claims a base from the pool and (``start_check``) compares
    every entry of it with its record, while git lists the live tree (a big base: in a
    child process, all through the scan). The scan then asks ``known`` for every file it
    has a digest for: the base holds exactly those bytes at that path (and its entry checked
    out), or the store has the object (its bytes checked); only a file neither holds is read
    into a new object (``new_file``, ``added``). A check that ran beside the scan is taken
    in by ``reconcile`` (what the scan took as kept, set right), before ``build``, which
    changes the base into the new tree: removals first, then folders, then links, then the
    changed folders sealed again; ``lend`` or ``park`` hands it on.
    """

    store: Store
    repo: str
    family: str
    full: bool = False
    dedups: bool = True
    # read a changed file once, into a new object, instead of hashing it first to ask
    # ``known``: set while changed files keep turning out to be new bytes (a first build)
    write_first: bool = False
    git_tree: str = ""  # set by the scan: the git tree id of the files it hashed
    work: Path = field(init=False)
    base: tuple[Note, Path] | None = field(init=False, default=None)
    base_rows: _table.Rows = field(init=False, default_factory=lambda: _table.Rows(RECORD))
    kept: set[str] = field(init=False, default_factory=set)  # base entries the tree keeps
    entries: dict[str, _Entry] = field(init=False, default_factory=dict)
    _table: _table.Table | None = field(init=False, default=None)
    _bad: set[str] = field(init=False, default_factory=set)  # base entries off their record
    _restamp: set[str] = field(init=False, default_factory=set)
    _made: dict[tuple[str, bytes], str] = field(init=False, default_factory=dict)
    _held: dict[tuple[str, bytes], str] = field(init=False, default_factory=dict)
    _rows: dict[str, Row] | None = field(init=False, default=None)  # None: unchanged
    _gone: set[str] = field(init=False, default_factory=set)
    _count: int = field(init=False, default=0)
    _streak: int = field(init=False, default=0)
    _work_fd: int = field(init=False, default=-1)
    _objects: dict[str, int] = field(init=False, default_factory=dict)
    _cursor: fsopen.DirCursor | None = field(init=False, default=None)  # the base's, for _still
    _beside: stamps.Beside | None = field(init=False, default=None)  # the check, if beside

    def __post_init__(self) -> None:
        self.store.sweep_work()
        started = started_at(os.getpid()) or "0"
        self.work = self.store.root / "work" / f"{os.getpid()}-{started}-{secrets.token_hex(4)}"
        self.work.mkdir(mode=0o700)
        self._work_fd = fsopen.open_dir(self.work)
        self._objects = self.store.object_dirs()
        claimed = self.store.claim(self.work, self.repo, self.family)
        if claimed is None:
            return
        table = self.store.record(claimed[0].id)
        if not table.rows or stamp_of(os.lstat(claimed[1]))[0] != claimed[0].root[0]:
            self.store.evict(claimed[0].id, claimed[1])
            return
        self.base, self._table = claimed, table
        self.base_rows = table.rows

    def check(self) -> None:
        """Compare every entry and folder of the base with its record (``lstat`` only);
        those that differ are re-hashed before use (``known``) or emptied of what they
        should not hold (``build``). Skipped under ``full``: the finished tree is hashed
        whole instead."""
        if self.base is None or self.full:
            return
        self._bad = stamps.off_record(self.base[1], self.base_rows)

    def start_check(self) -> None:
        """``check``, or for a big base, the same check begun in a child process beside the
        scan (``choir.evidence.stamps``): the scan then takes every base entry whose digest
        matches as kept, and ``reconcile`` sets right those the check finds off their
        record before anything is built."""
        if self.base is None or self.full:
            return
        rows = len(self.base_rows)
        if rows < stamps.SPAWN_ROWS or self._table is None:
            self.check()
            return
        try:
            self._beside = stamps.Beside(self.base[1], self._table.path, self._table.loaded,
                                         rows)
        except OSError:
            self.check()

    def reconcile(self) -> None:
        """The answer of a check begun beside the scan, taken in: each kept entry off its
        record is kept only if its bytes (or link text) still match, else the store's
        checked object of those bytes replaces it.

        Raises:
            StaleBase: an entry the scan took as kept matches neither (someone wrote it, and
                the store's copy, between rounds): the snapshot is made again, checked first.
        """
        beside, self._beside = self._beside, None
        if beside is None:
            return
        bad = beside.result()
        if bad is None:  # no answer: the same check, here
            self.check()
        else:
            self._bad = bad
        for rel in sorted(self._bad & self.kept):  # path order: the cursor opens each folder once
            row = self.base_rows[rel]
            kind, digest = row[5].decode(), row[6]
            if self._still(rel.split("/"), kind, digest):
                self._restamp.add(rel)
                continue
            self.kept.discard(rel)
            held = None if kind == "l" else \
                self._made.get((kind, digest)) or self._held.get((kind, digest)) or \
                self._hold(kind, digest)
            if held is None:
                raise StaleBase(rel)
            self.entries[rel] = _Entry(kind, digest, "new", held)

    # -- the scan's questions ----------------------------------------------------------------
    def known(self, rel: str, parts: list[str], kind: str, digest: bytes, *,
              miss: bool = False) -> bool:
        """True when the tree can hold ``rel`` with these bytes without reading the live
        file: the base holds exactly them, or the store has the object. ``miss``: asked for
        a file that was just read (its answer steers ``write_first``)."""
        found = self._known(rel, parts, kind, digest)
        if miss:
            self._streak = 0 if found else self._streak + 1
            self.write_first = self._streak >= 8
        return found

    def _known(self, rel: str, parts: list[str], kind: str, digest: bytes) -> bool:
        row = self.base_rows.get(rel)
        if row is not None and row[6] == digest and row[5] == kind.encode() and \
                (rel not in self._bad or self._still(parts, kind, digest)):
            if rel in self._bad:
                self._restamp.add(rel)
            self.kept.add(rel)
            return True
        if kind == "l":
            return False
        made = self._made.get((kind, digest))
        held = made or self._held.get((kind, digest)) or self._hold(kind, digest)
        if held is None:
            return False
        self.entries[rel] = _Entry(kind, digest, "new", held)
        return True

    def _still(self, parts: list[str], kind: str, digest: bytes) -> bool:
        """A base entry off its record (another tree linked or unlinked the object, or
        someone wrote it): kept only if its bytes (or link text) still match."""
        assert self.base is not None
        try:
            if self._cursor is None:  # one for the scan: it asks in path order
                self._cursor = fsopen.DirCursor(self.base[1])
            folder = self._cursor.dir(parts[:-1])
            if kind != "l":
                return bytes_match(folder, parts[-1], kind, digest)
            text = os.readlink(parts[-1], dir_fd=folder)
        except OSError:
            return False
        return blake3.blake3(text.encode("utf-8", "surrogateescape")).digest() == digest

    def _drop_cursor(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None

    def _hold(self, kind: str, digest: bytes) -> str | None:
        """The store's object for these bytes, linked into work/ and checked through that
        link (so what is checked is what the tree will link), or None."""
        self._count += 1
        name = f"h{self._count}"
        try:
            os.link(digest.hex(), name, src_dir_fd=self._objects[kind],
                    dst_dir_fd=self._work_fd, follow_symlinks=False)
        except OSError:
            return None
        if not bytes_match(self._work_fd, name, kind, digest):
            os.unlink(name, dir_fd=self._work_fd)
            return None
        self._held[(kind, digest)] = name
        return name

    def new_file(self, kind: str) -> tuple[int, str]:
        """A new object file of ``kind`` to write the bytes into, and its name in work/."""
        self._count += 1
        name = f"o{self._count}"
        fd = fsopen.create_file(name, self._work_fd, MODES[kind])
        os.fchmod(fd, MODES[kind])
        return fd, name

    def added(self, rel: str, kind: str, digest: bytes, name: str) -> None:
        """``rel``'s bytes were written to new object ``name`` and hash to ``digest``; when
        they were written first (``write_first``) and the store holds them after all, the
        new object is dropped."""
        if self.write_first and (kind, digest) not in self._made and \
                self.known(rel, rel.split("/"), kind, digest, miss=True):
            os.unlink(name, dir_fd=self._work_fd)
            return
        first = self._made.setdefault((kind, digest), name)
        if first != name:
            os.unlink(name, dir_fd=self._work_fd)
        self.entries[rel] = _Entry(kind, digest, "new", first)

    def symlink(self, rel: str, target: str, digest: bytes) -> None:
        self.entries[rel] = _Entry("l", digest, "link", target)

    def cached_git_tree(self, tree_hash: str, oid_len: int) -> str | None:
        """The git tree id recorded for ``tree_hash`` when the base was that very tree (a
        round on an unchanged tree skips recomputing it)."""
        note = self.base[0] if self.base is not None and not self.full else None
        if note is not None and note.tree_hash == tree_hash and len(note.git_tree) == oid_len:
            return note.git_tree
        return None

    # -- building -------------------------------------------------------------------------
    def build(self) -> Path:
        """The new tree, sealed, in the work folder (the claimed base changed into it)."""
        self._drop_cursor()
        base_dirs = self.base_rows.where(5, DIR)
        base_files = self.base_rows.keys() - base_dirs
        gone = base_files - self.kept
        if self.base is not None and not gone and not self.entries and not self._bad \
                and not self.full and self._top_as_recorded():
            self._rows = None  # the same tree again: nothing to change
            return self.base[1]
        if self.base is not None:
            tree = self.base[1]
        else:
            tree = self.work / "tree"
            tree.mkdir(mode=0o755)
        dropped_files = gone - self.entries.keys()
        want_dirs = base_dirs if not dropped_files and self.entries.keys() <= base_files \
            else _dirs_of(self.kept | self.entries.keys())
        touched: set[str] = set() if self.base is not None else {""}
        with fsopen.DirCursor(tree) as cursor:
            if self.base is not None and not self.full:
                self._clean_dirs(cursor, base_dirs & want_dirs, touched)
            self._remove(cursor, gone | (self.entries.keys() & base_files), touched)
            dropped = sorted(base_dirs - want_dirs, key=lambda r: -r.count("/"))
            for rel in dropped:
                self._rmdir(cursor, rel, touched)
            made = want_dirs - base_dirs
            for rel in sorted(made | self.entries.keys()):  # parents first, each opened once
                entry = self.entries.get(rel)
                if entry is not None:
                    self._place(cursor, rel, entry, touched)
                    continue
                parts = rel.split("/")
                os.mkdir(parts[-1], 0o755, dir_fd=self._writable(cursor, parts[:-1], touched))
                touched.add(rel)
        self._commit_objects()
        self._gone = dropped_files | set(dropped)
        restat = self.entries.keys() | self._restamp | (touched - {""}) | made
        if self.full:
            restat |= self.kept | want_dirs
        self._rows = self._seal(tree, touched, restat, want_dirs)
        return tree

    def _top_as_recorded(self) -> bool:
        """The claimed tree's top folder lists exactly the record's top-level names. The top
        is in no row (claiming renames it, so its stamps move): a name planted there is seen
        only here, or by ``_clean_dirs`` when anything else changed (review 18d F1)."""
        assert self.base is not None
        top = {rel for rel in self.base_rows if "/" not in rel}
        try:
            return set(os.listdir(self.base[1])) == top
        except OSError:
            return False

    def _writable(self, cursor: fsopen.DirCursor, parts: list[str], touched: set[str]) -> int:
        fd = cursor.dir(parts)
        rel = "/".join(parts)
        if rel not in touched:
            os.fchmod(fd, 0o755)
            touched.add(rel)
        return fd

    def _clean_dirs(self, cursor: fsopen.DirCursor, dirs: set[str], touched: set[str]) -> None:
        """Folders of the base off their record lose every name the record does not list:
        something was planted in them. The root is always listed (claiming renamed it)."""
        assert self.base is not None
        suspect = {""} | (self._bad & dirs)
        children: dict[str, set[str]] = {}
        for rel in self.base_rows:
            parent, _, leaf = rel.rpartition("/")
            if parent in suspect:
                children.setdefault(parent, set()).add(leaf)
        for rel in sorted(suspect):
            parts = rel.split("/") if rel else []
            for name in os.listdir(cursor.dir(parts)):
                if name not in children.get(rel, ()):
                    folder = self._writable(cursor, parts, touched)
                    _remove_name(folder, name, self.base[1] / rel / name)
            if rel:
                touched.add(rel)  # recorded again, whatever it holds now

    def _remove(self, cursor: fsopen.DirCursor, names: set[str], touched: set[str]) -> None:
        """Unlink the base's files at ``names`` (dropped, or replaced by new bytes)."""
        for rel in sorted(names):
            row = self.base_rows[rel]
            parts = rel.split("/")
            try:
                os.unlink(parts[-1], dir_fd=self._writable(cursor, parts[:-1], touched))
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP):
                    raise
                continue
            if row[5] in (b"f", b"x"):
                self._drop_object(row[5].decode(), row[6], row[0])

    def _rmdir(self, cursor: fsopen.DirCursor, rel: str, touched: set[str]) -> None:
        assert self.base is not None
        parts = rel.split("/")
        try:
            os.rmdir(parts[-1], dir_fd=self._writable(cursor, parts[:-1], touched))
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                rmtree(self.base[1] / rel)
            elif exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
        touched.discard(rel)

    def _place(self, cursor: fsopen.DirCursor, rel: str, entry: _Entry,
               touched: set[str]) -> None:
        parts = rel.split("/")
        parent = self._writable(cursor, parts[:-1], touched)
        if entry.source == "link":
            os.symlink(entry.origin, parts[-1], dir_fd=parent)
            return
        try:
            os.link(entry.origin, parts[-1], src_dir_fd=self._work_fd, dst_dir_fd=parent,
                    follow_symlinks=False)
        except OSError as exc:
            if exc.errno != errno.EMLINK:
                raise
            self._copy_in(entry, parts[-1], parent)

    def _copy_in(self, entry: _Entry, name: str, parent: int) -> None:
        """An object linked the most times a file system allows: a fresh copy of it becomes
        the store's object from now on."""
        fd = os.open(entry.origin, fsopen.FILE, dir_fd=self._work_fd)
        os.set_blocking(fd, True)
        out, made = self.new_file(entry.kind)
        try:
            with os.fdopen(fd, "rb") as fh:
                for chunk in iter(lambda: fh.read(CHUNK), b""):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
        finally:
            os.close(out)
        os.link(made, name, src_dir_fd=self._work_fd, dst_dir_fd=parent)
        self._made[(entry.kind, entry.digest)] = entry.origin = made

    def _commit_objects(self) -> None:
        """Move the new objects into ``objects/`` (each replacing any older copy's name)."""
        for (kind, digest), name in self._made.items():
            os.rename(name, digest.hex(), src_dir_fd=self._work_fd,
                      dst_dir_fd=self._objects[kind])

    def _drop_object(self, kind: str, digest: bytes, ino: int) -> None:
        """Drop the store's name of an object no tree links any more (GC by link count: a
        name another tree links, or that names a newer copy, stays)."""
        with contextlib.suppress(OSError):
            st = os.stat(digest.hex(), dir_fd=self._objects[kind], follow_symlinks=False)
            if st.st_ino == ino and st.st_nlink == 1:
                os.unlink(digest.hex(), dir_fd=self._objects[kind])

    def _seal(self, tree: Path, touched: set[str], restat: set[str],
              want_dirs: set[str]) -> dict[str, Row]:
        """Seal the folders changed (0555 again) and return the rows that changed: every
        entry in ``restat`` with its ``lstat`` now, in one pass in path order (each folder
        opened once; the objects' last link and rename are behind, so no later step of
        this build moves a ctime recorded here)."""
        rows: dict[str, Row] = {}
        with fsopen.DirCursor(tree) as cursor:
            if "" in touched:
                os.fchmod(cursor.dir([]), 0o555)
            for rel in sorted(restat | touched - {""}):
                parts = rel.split("/")
                if rel in touched:
                    fd = cursor.dir(parts)
                    os.fchmod(fd, 0o555)
                    rows[rel] = (*stamp_of(os.fstat(fd)), DIR, bytes(32))
                    continue
                st = os.stat(parts[-1], dir_fd=cursor.dir(parts[:-1]), follow_symlinks=False)
                if rel in want_dirs:
                    rows[rel] = (*stamp_of(st), DIR, bytes(32))
                    continue
                entry = self.entries.get(rel)
                if entry is not None:
                    rows[rel] = (*stamp_of(st), entry.kind.encode(), entry.digest)
                else:
                    old = self.base_rows[rel]
                    rows[rel] = (*stamp_of(st), old[5], old[6])
        return rows

    # -- handing the tree out ---------------------------------------------------------------
    def _settle(self, tree_hash: str) -> Note:
        """Write the new tree's record (only its changed rows, when it was the base) and
        return its note."""
        note = self.base[0] if self.base else Note(id=secrets.token_hex(8))
        note.tree_hash, note.repo, note.family = tree_hash, self.repo, self.family
        note.git_tree = self.git_tree
        changed = cast(dict[str, tuple[object, ...]], self._rows or {})
        if self._table is not None and self.base is not None:
            self._table.save(changed, self._gone)
        else:
            self.store.record(note.id).replace(changed)
        self.base = None
        return note

    def lend(self, tree: Path, place: Path, tree_hash: str) -> None:
        """``tree`` (from ``build``) now at ``place`` after the caller renamed it."""
        note = self._settle(tree_hash)
        note.pid, note.started = os.getpid(), started_at(os.getpid()) or ""
        self.store.lend(note, place)

    def park(self, tree: Path, tree_hash: str) -> None:
        """``tree`` was not needed (an equal one is lent already): into the pool."""
        self.store.park_from(self._settle(tree_hash), tree)

    def discard(self, tree: Path | None) -> None:
        """Drop the tree being built (a check failed, or the scan did)."""
        if self.base is not None:
            self.store.evict(self.base[0].id, tree or self.base[1])
            self.base = None
        elif tree is not None:
            rmtree(tree)

    def close(self) -> None:
        """Release the work folder; a base still held (the build failed) is dropped."""
        if self._beside is not None:
            self._beside.close()
            self._beside = None
        self._drop_cursor()
        if self.base is not None:
            self.discard(None)
        if self._work_fd >= 0:
            os.close(self._work_fd)
            self._work_fd = -1
        for fd in self._objects.values():
            os.close(fd)
        self._objects = {}
        rmtree(self.work)


def _dirs_of(entries: Iterable[str]) -> set[str]:
    """Every folder (as a relative path) that holds one of ``entries``."""
    dirs: set[str] = set()
    for rel in entries:
        parent = rel.rpartition("/")[0]
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    return dirs


def _remove_name(dir_fd: int, name: str, path: Path) -> None:
    """Remove ``name`` from folder ``dir_fd`` whatever it is (a planted folder whole)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        rmtree(path)
    else:
        os.unlink(name, dir_fd=dir_fd)

