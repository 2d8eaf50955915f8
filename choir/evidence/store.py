"""Incremental snapshots: a round's sealed tree is built from a sealed tree already there.

Copying the whole tree into a fresh folder every round made the snapshot the cost of a
round. Measured on this machine's ext4 (mounted with ``discard``; docs/performance.md,
"Incremental snapshots"): creating a file with its bytes costs 44-300 us, a folder 75-150 us,
removing a folder 3.3 ms (Django's 3,233 folders: 11 s to delete one copy), a hard link 8-10
us, an ``lstat`` 2 us. So the cost to avoid is creating and removing folders and files, not
reading bytes. Three ways were weighed:

* hard links into a content-addressed store, in a fresh folder tree each round: links are
  cheap, but every round still makes and removes every folder (Django: 0.3-0.5 s to make,
  10 s to remove);
* a tmpfs: every operation is cheap (link 3 us, folder 2-4 us), but the store would hold the
  bytes of every tree in memory, and a container's ``/dev/shm`` is often 64 MB;
* a read-only overlay of a sealed base: no cost at all per file, but the snapshot would then
  be a mount, not a folder: Docker's engine, the spec views, held-out copies and the cluster
  fan-out all read the snapshot as a plain folder on the host.

Chosen: the first, without its folder cost. Files are sealed once into ``objects/`` (0444,
or 0555 when executable; named by kind and blake3) and sealed trees are folders of hard
links to them. A tree that is no longer verified is not removed but *parked* in ``pool/``;
the next snapshot of the same repo (or of another worktree of it) claims it, checks it, and
changes only what differs: a changed file is one unlink and one link, a second round on the
same tree changes nothing. Folders are made or removed only when the tree's folders change.

Guarantees (docs/security.md, "Incremental snapshots"):

* An object's bytes are the bytes that were hashed: it is written from the same read that
  hashes it, never linked from the live repo (an executor writes its repo in place, and a
  link would carry that write into every tree sharing the file).
* Nothing a step or an executor can do changes an object: steps see a tree through a
  read-only bind as uid 65534 (the objects are the caller's, 0444; a link to them from
  ``$CHOIR_OUT`` or ``/tmp`` crosses a mount and fails with EXDEV), and executors never see
  the store (it is under the artifact folder, masked in their sandbox).
* Tampering by anyone else is detected, not used: a tree's record keeps each link's inode,
  size, mtime, ctime and mode, and each folder's; a claim compares every one with ``lstat``
  (ctime cannot be set back, so a write, a chmod or a ``touch -d`` shows). An entry that
  differs is re-hashed from the tree and kept only if its bytes still match; a folder that
  differs has every name it should not hold removed. PARANOID does not rely on any of it:
  the finished tree is hashed again, whole, and must give the tree hash (``tree.py``).

A tree is lent to a caller at a place (``root/<tree hash>``) and parked again by
``remove_snapshot``; a tree lent to a process that died is parked by the next claim. The pool
keeps ``POOL_MAX`` parked trees; an object no tree links any more is dropped when the last
tree unlinks it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import blake3

from choir._core import fsopen
from choir._core.paths import artifact_dir
from choir.evidence import _table

POOL_MAX = 8
MODES = {"f": 0o444, "x": 0o555}
RECORD = "<QqqqQc32s"  # ino, size, mtime_ns, ctime_ns, mode, kind (f x l d), blake3
CHUNK = 1 << 20
Row = tuple[int, int, int, int, int, bytes, bytes]
DIR = b"d"


def store_root() -> Path:
    """Where the store lives: beside the snapshots, on the same file system."""
    return artifact_dir() / "trees"


def rmtree(path: Path) -> None:
    """Remove a sealed folder tree (read-only folders unsealed first); missing is fine.

    Each folder is opened before it is listed, top down and never through a link: a walk
    that lists first could not read a folder of mode 0311 (one an executor planted, for
    ``choir.executors.gitguard``), so it unsealed nothing and the removal left it whole."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        todo = [str(path)]
        while todo:
            folder = todo.pop()
            with contextlib.suppress(OSError):
                os.chmod(folder, 0o755, follow_symlinks=False)
                with os.scandir(folder) as it:
                    todo += [item.path for item in it if item.is_dir(follow_symlinks=False)]
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def stamp_of(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def started_at(pid: int) -> str | None:
    """The start time of process ``pid`` (so a reused pid is not taken for it), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str) -> bool:
    """True while process ``pid`` is the one that started at ``started`` (a reused pid is
    another process; a /proc this process cannot read counts as alive, never as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = started_at(pid)
    return now is None or now == started


def bytes_match(dir_fd: int, name: str, kind: str, digest: bytes) -> bool:
    """True when ``name`` in ``dir_fd`` is a regular file of ``kind``'s sealed mode whose
    bytes hash to ``digest`` (no link followed)."""
    try:
        fd, st = fsopen.open_regular(name, dir_fd)
    except OSError:
        return False
    hasher = blake3.blake3(max_threads=1)
    with os.fdopen(fd, "rb") as fh:
        if stat.S_IMODE(st.st_mode) != MODES.get(kind):
            return False
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            hasher.update(chunk)
    return hasher.digest() == digest


@dataclass
class Note:
    """A sealed tree's small record: what it holds and where it is."""

    id: str
    tree_hash: str = ""
    repo: str = ""
    family: str = ""
    state: str = "parked"  # parked | lent | building
    place: str = ""
    pid: int = 0
    started: str = ""
    root: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    used: float = 0.0
    git_tree: str = ""  # the git tree id of tree_hash's files (the clean-commit check)

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @classmethod
    def decode(cls, data: bytes) -> Note | None:
        try:
            raw = json.loads(data)
            raw["root"] = tuple(raw["root"])
            return cls(**raw)
        except (ValueError, TypeError, KeyError):
            return None


class Store:
    """The store folder: ``objects/``, ``pool/`` (parked trees), ``notes/`` and
    ``records/`` (per tree), ``stat/`` (the stat caches) and ``work/`` (per build)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def for_place(cls, place: Path, *, create: bool = True) -> Store | None:
        """The store, when a tree in it can be renamed to ``place`` (the same file system)
        and ``CHOIR_TREE_STORE`` is not ``off``; None otherwise."""
        if os.environ.get("CHOIR_TREE_STORE", "").lower() in ("off", "0", "no"):
            return None
        root = store_root()
        if not root.is_dir():
            if not create:
                return None
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
        existing = place
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if os.stat(existing).st_dev != os.stat(root).st_dev:
            return None
        for sub in ("objects", "pool", "notes", "records", "work", "stat"):
            (root / sub).mkdir(mode=0o700, exist_ok=True)
        return cls(root)

    # -- notes ----------------------------------------------------------------------------
    def _note(self, tree_id: str) -> Note | None:
        try:
            data = fsopen.read_bytes(self.root / "notes", tree_id, 1 << 16)
        except OSError:
            return None
        return Note.decode(data)

    def _notes(self) -> list[Note]:
        found = []
        for name in sorted(os.listdir(self.root / "notes")):
            note = self._note(name) if not name.startswith(".") else None
            if note is not None and note.id == name:
                found.append(note)
        return found

    def _write_note(self, note: Note) -> None:
        path = self.root / "notes" / note.id
        tmp = path.with_name(f".{note.id}.{secrets.token_hex(4)}")
        tmp.write_bytes(note.encode())
        os.replace(tmp, path)

    def _forget(self, tree_id: str) -> None:
        for sub in ("notes", "records"):
            (self.root / sub / tree_id).unlink(missing_ok=True)

    def record(self, tree_id: str) -> _table.Table:
        """The record of tree ``tree_id``: a row per file and folder (empty when lost)."""
        return _table.Table(self.root / "records" / tree_id, RECORD)

    # -- objects ----------------------------------------------------------------------------
    def object_dirs(self) -> dict[str, int]:
        """Descriptors of ``objects/f`` and ``objects/x`` (an object's name there is the hex
        blake3 of its bytes; the caller closes them)."""
        fds = {}
        for kind in MODES:
            (self.root / "objects" / kind).mkdir(mode=0o700, parents=True, exist_ok=True)
            fds[kind] = fsopen.open_dir(self.root / "objects" / kind)
        return fds

    # -- the pool ---------------------------------------------------------------------------
    def _recover(self, note: Note) -> None:
        """Park a tree lent to (or being built by) a process that is gone."""
        if note.state == "parked" or (note.pid and _alive(note.pid, note.started)):
            return
        if note.state == "lent" and note.place:
            place = Path(note.place)
            try:
                if os.lstat(place).st_ino == note.root[0]:
                    os.rename(place, self.root / "pool" / note.id)
                    self._parked(note)
                    return
            except OSError:
                pass
        self._forget(note.id)  # built halfway or gone: its folder (if any) goes with work/

    def _parked(self, note: Note) -> None:
        note.state, note.place, note.pid, note.started = "parked", "", 0, ""
        note.root = stamp_of(os.lstat(self.root / "pool" / note.id))
        note.used = time.time()
        self._write_note(note)

    def claim(self, work: Path, repo: str, family: str) -> tuple[Note, Path] | None:
        """Take the parked tree best suited as a base for ``repo`` (the one last used for
        it, else one of another worktree of the same repository) into ``work``."""
        notes = self._notes()
        for note in notes:
            self._recover(note)
        parked = [n for n in notes if n.state == "parked"]
        ranked = sorted((n for n in parked if n.repo == repo or (family and n.family == family)),
                        key=lambda n: (n.repo == repo, n.used), reverse=True)
        for note in ranked:
            here = work / f"base-{note.id}"
            try:
                os.rename(self.root / "pool" / note.id, here)
            except OSError:
                continue  # another caller took it first
            note.state, note.pid = "building", os.getpid()
            note.started = started_at(os.getpid()) or ""
            self._write_note(note)
            return note, here
        return None

    def lend(self, note: Note, place: Path) -> None:
        """Record tree ``note`` as lent at ``place`` (renamed there by the caller)."""
        note.state, note.place = "lent", os.path.abspath(place)
        note.root = stamp_of(os.lstat(place))
        note.used = time.time()
        self._write_note(note)

    def park_from(self, note: Note, folder: Path) -> None:
        """Park the tree of ``note``, now at ``folder``, in the pool."""
        os.rename(folder, self.root / "pool" / note.id)
        self._parked(note)
        self._trim()

    def reclaim(self, under: Path) -> None:
        """Park every tree lent at ``under`` or inside it (``remove_snapshot``)."""
        top = os.path.abspath(under)
        for note in self._notes():
            if note.state != "lent" or not (note.place == top
                                            or note.place.startswith(top + "/")):
                continue
            place = Path(note.place)
            try:
                if os.lstat(place).st_ino != note.root[0]:
                    continue
                os.rename(place, self.root / "pool" / note.id)
            except OSError:
                continue
            self._parked(note)
        self._trim()

    def _lent_at(self, place: Path) -> Note | None:
        for note in self._notes():
            if note.state == "lent" and note.place == os.path.abspath(place):
                return note
        return None

    def holds(self, place: Path, tree_hash: str) -> bool | None:
        """Whether the tree lent at ``place`` is still tree ``tree_hash``, by the ``lstat``
        of every entry and folder against its record (nothing read); None when no tree of
        the store is lent there. The caller becomes its holder (a resumed run reuses the
        tree a killed one was lent)."""
        note = self._lent_at(place)
        if note is None:
            return None
        rows = self.record(note.id).rows
        if not rows or note.tree_hash != tree_hash:
            return False
        try:
            root = os.lstat(place)
            if stamp_of(root)[:4] != note.root[:4]:
                return False
            with fsopen.DirCursor(place) as cursor:
                for rel, row in rows.items():
                    parts = rel.split("/")
                    st = os.stat(parts[-1], dir_fd=cursor.dir(parts[:-1]),
                                 follow_symlinks=False)
                    if stamp_of(st) != row[:5]:
                        return False
        except OSError:
            return False
        note.pid, note.started = os.getpid(), started_at(os.getpid()) or ""
        self._write_note(note)
        return True

    def _trim(self) -> None:
        """Evict the least recently used parked trees beyond ``POOL_MAX``."""
        parked = sorted((n for n in self._notes() if n.state == "parked"), key=lambda n: n.used)
        for note in parked[:max(0, len(parked) - POOL_MAX)]:
            self.evict(note.id)

    def evict(self, tree_id: str, folder: Path | None = None) -> None:
        """Remove tree ``tree_id`` (from the pool, or at ``folder``) and its notes."""
        path = folder or self.root / "pool" / tree_id
        doomed = self.root / "work" / f"evict-{tree_id}-{secrets.token_hex(4)}"
        try:
            os.rename(path, doomed)
        except OSError:
            doomed = path if folder is not None else doomed
        self._forget(tree_id)
        rmtree(doomed)
        self.sweep_objects()

    def sweep_objects(self) -> None:
        """Drop every object no tree links any more (its name in ``objects/`` its only
        link): after an eviction, the objects only the evicted tree held. An object is
        linked into its tree before its name appears here, so a build under way never
        loses one."""
        for kind in (*MODES, "F", "X"):
            folder = self.root / "objects" / kind
            try:
                fd = fsopen.open_dir(folder)
            except OSError:
                continue
            try:
                for name in os.listdir(fd):
                    with contextlib.suppress(OSError):
                        if os.stat(name, dir_fd=fd, follow_symlinks=False).st_nlink == 1:
                            os.unlink(name, dir_fd=fd)
            finally:
                os.close(fd)

    def sweep_work(self) -> None:
        """Remove work folders left by builds whose process is gone."""
        for name in os.listdir(self.root / "work"):
            pid, _, rest = name.partition("-")
            if pid.isdigit() and _alive(int(pid), rest.rsplit("-", 1)[0]):
                continue
            if name.startswith("evict-") or pid.isdigit():
                rmtree(self.root / "work" / name)
