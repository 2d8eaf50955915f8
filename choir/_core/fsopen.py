"""Hostile paths are opened, never resolved.

Every tree Choir reads on the host (the repo after an executor ran, a snapshot, a step's
``$CHOIR_OUT``) was arranged by code Choir does not trust, and Choir reads it with the
signing key in reach. A path such as ``lnk/ed25519.key`` is safe to read only if no
component of it is a symlink: checking the last component (``lstat``) is not enough, since
the kernel follows every intermediate one, and checking first and opening afterwards loses a
race with a process that swaps a folder for a link in between.

So a path is never handed to the kernel whole. It is walked one component at a time from a
directory descriptor with ``O_NOFOLLOW`` (``O_DIRECTORY`` for folders): a link anywhere on
the way fails the open (``ELOOP``/``ENOTDIR``) instead of being followed, whenever it was
planted. Regular files are checked after opening (``fstat``), so a FIFO cannot block and a
device cannot be read. This module is the one place that does it; everything that reads
such a tree goes through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Collection, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

_PROBE = 256  # lstat_many: calls timed before it decides to spread the rest
_SLOW_S = 20e-6  # an lstat slower than this on average: read from disk, not cached

DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(path: str | Path, dir_fd: int | None = None) -> int:
    """A descriptor of the folder ``path`` (one component when ``dir_fd`` is given).

    Raises:
        OSError: it is missing, not a folder, or a symlink.
    """
    return os.open(path, DIR, dir_fd=dir_fd)


def open_regular(name: str, dir_fd: int) -> tuple[int, os.stat_result]:
    """A blocking read descriptor of the regular file ``name`` in ``dir_fd``, and its stat.

    Raises:
        OSError: it is missing, a symlink (``ELOOP``), or not a regular file (``EINVAL``).
    """
    fd = os.open(name, FILE, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", name)
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def create_file(name: str, dir_fd: int, mode: int) -> int:
    """A write descriptor of a new file ``name`` in ``dir_fd`` (never an existing one)."""
    return os.open(name, _NEW, mode, dir_fd=dir_fd)


def split(rel: str) -> list[str]:
    """The components of a relative posix path; refuses ``..``, absolute and empty paths.

    Raises:
        OSError: ``rel`` is not a clean relative path (``EINVAL``).
    """
    parts = rel.split("/")
    if not rel or "\0" in rel or "" in parts or "." in parts or ".." in parts:
        raise OSError(errno.EINVAL, "not a clean relative path", rel)
    return parts


class DirCursor:
    """Descriptors of the folders along one relative path, reused for the next path.

    A sorted listing visits the files of one folder together, so walking each path from
    the root again would reopen the same folders thousands of times; the cursor keeps the
    chain of the last path open and reopens only from where the next path differs. With
    ``create`` missing folders are made (for writing a copy into a private folder).
    """

    def __init__(self, root: str | Path | int, *, create: bool = False) -> None:
        # a root given as a descriptor is the folder it holds, wherever that now is
        self._root = open_dir(".", root) if isinstance(root, int) else open_dir(root)
        self._chain: list[tuple[str, int]] = []
        self._last: list[str] | None = None  # the parts of the chain, when it is whole
        self._create = create

    def dir(self, parts: Sequence[str]) -> int:
        """The descriptor of folder ``parts`` (from the root), valid until the next call.

        Raises:
            OSError: a component is missing (without ``create``), a symlink or not a folder.
        """
        if parts == self._last:  # the folder of the last call: most calls, in path order
            return self._chain[-1][1] if self._chain else self._root
        self._last = None
        keep = 0
        for (name, _fd), want in zip(self._chain, parts, strict=False):
            if name != want:
                break
            keep += 1
        for _name, fd in self._chain[keep:]:
            os.close(fd)
        del self._chain[keep:]
        for name in parts[keep:]:
            parent = self._chain[-1][1] if self._chain else self._root
            try:
                fd = open_dir(name, parent)
            except FileNotFoundError:
                if not self._create:
                    raise
                os.mkdir(name, 0o755, dir_fd=parent)
                fd = open_dir(name, parent)
            self._chain.append((name, fd))
        self._last = list(parts)
        return self._chain[-1][1] if self._chain else self._root

    def close(self) -> None:
        for _name, fd in self._chain:
            os.close(fd)
        self._chain.clear()
        self._last = None
        if self._root >= 0:
            os.close(self._root)
            self._root = -1

    def __enter__(self) -> DirCursor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def lstat_many(root: str | Path, rels: Sequence[str],
               workers: int = 4) -> list[os.stat_result | OSError]:
    """The ``lstat`` of every path in ``rels`` (sorted, relative to ``root``), or the error
    reaching it raised, walked by descriptor as ``DirCursor`` does.

    Taken in the calling thread while the calls are quick: an ``lstat`` whose inode is
    cached costs 2-3 us here, and spreading such calls over threads made them slower, not
    faster (50,000 of them: 0.13 s in one thread, 0.25 s in four, quiet or with both cores
    busy; docs/performance.md), as each call hands the interpreter lock over. Only when the
    first ``_PROBE`` calls average over ``_SLOW_S`` (inodes read from disk: a tree nobody
    has touched for a while) is the rest split among ``workers`` threads, as ``git status``
    spreads its ``lstat`` calls, each waiting on the disk without the lock.
    """
    if not rels:  # nothing to reach: the root is not opened (it may not exist)
        return []
    out: list[os.stat_result | OSError] = [OSError()] * len(rels)

    def run(start: int, end: int) -> None:
        with DirCursor(root) as cursor:
            for i in range(start, end):
                try:
                    parts = split(rels[i])
                    out[i] = os.stat(parts[-1], dir_fd=cursor.dir(parts[:-1]),
                                     follow_symlinks=False)
                except OSError as exc:
                    out[i] = exc

    probe = min(len(rels), _PROBE)
    began = time.perf_counter()
    run(0, probe)
    rest = len(rels) - probe
    if not rest:
        return out
    if workers <= 1 or time.perf_counter() - began < _SLOW_S * probe:
        run(probe, len(rels))
        return out
    chunk = max(2048, -(-rest // workers))
    bounds = [(i, min(i + chunk, len(rels))) for i in range(probe, len(rels), chunk)]
    threads = [threading.Thread(target=run, args=b, daemon=True) for b in bounds[1:]]
    for thread in threads:
        thread.start()
    try:
        run(*bounds[0])
    finally:
        for thread in threads:
            thread.join()
    return out


def read_bytes(root: str | Path | int, rel: str, limit: int | None) -> bytes:
    """The regular file ``rel`` under ``root`` (a folder's path or descriptor; its first
    ``limit`` bytes when given), no link followed.

    Raises:
        OSError: a component is missing, a symlink, or the file is not a regular file.
    """
    parts = split(rel)
    with DirCursor(root) as cursor:
        fd, _st = open_regular(parts[-1], cursor.dir(parts[:-1]))
    with os.fdopen(fd, "rb") as fh:
        return fh.read() if limit is None else fh.read(limit)


@dataclass(frozen=True)
class Entry:
    """One thing found by ``walk``: its path from the root, its folder's descriptor (valid
    while the walk is at it), its name there, and its ``lstat``."""

    rel: str
    dir_fd: int
    name: str
    st: os.stat_result


MAX_DEPTH = 256
"""Folders a tree Choir reads may nest (a snapshot's scan, the look for a repository planted
in a plan item's worktree): deeper is refused, as ``TooDeep``, not walked."""


class TooDeep(OSError):
    """A folder lies deeper than the walk's bound (raised by ``walk``)."""


class Unlistable(OSError):
    """A folder ``walk`` could not open or list (its ``filename`` is the folder's path from
    the root, ``.`` for the root): what it holds is unknown, so a caller refuses it or
    counts it as over, never passes it by."""


# a folder that was removed, or swapped for a link or a file, since it was listed
GONE = frozenset({errno.ENOENT, errno.ELOOP, errno.ENOTDIR})


def walk(root: str | Path, *, skip: Collection[str] = (), max_depth: int | None = None,
         ordered: bool = True) -> Generator[Entry, None, None]:
    """Every entry under ``root``, folders before what they hold, without following any
    link; ``skip`` names folders not entered at any depth.

    Folders are descended through their descriptors, so a folder swapped for a symlink (or
    removed) during the walk fails to open and is not entered. A folder that exists but
    cannot be opened or listed (mode 000, to a user without root) fails the walk: every
    caller reads a tree someone else arranged, and a folder passed over silently hid what
    it held (review 21: one walker, failing closed, for every caller). A caller that stops
    at a bound of its own simply stops iterating; the descriptors are closed then.

    ``ordered`` lists each folder sorted by name (its names held while it is walked);
    without it a folder's entries stream as the kernel lists them, and only the names of
    its subfolders wait, one descriptor per level (``$CHOIR_OUT``'s watchdog, on a tree a
    running step may fill with millions of files).

    Raises:
        TooDeep: a folder lies deeper than ``max_depth`` (the root's children are at depth 1,
            so ``max_depth`` folders may nest inside the root).
        Unlistable: a folder (the root included) could not be opened or listed.
        FileNotFoundError: ``root`` does not exist.
    """
    try:
        top = open_dir(root)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Unlistable(exc.errno, exc.strerror or str(exc), ".") from None
    try:
        yield from _walk(top, "", 1, skip, max_depth, ordered)
    finally:
        os.close(top)


def _walk(dfd: int, prefix: str, depth: int, skip: Collection[str],
          max_depth: int | None, ordered: bool) -> Iterator[Entry]:
    folders: list[str] = []
    try:
        listed = iter(sorted(os.listdir(dfd))) if ordered else _names(dfd)
        for name in listed:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield Entry(prefix + name, dfd, name, st)
            if stat.S_ISDIR(st.st_mode) and name not in skip:
                if ordered:
                    yield from _enter(dfd, prefix, name, depth, skip, max_depth, ordered)
                else:
                    folders.append(name)
    except (TooDeep, Unlistable):
        raise
    except OSError as exc:
        raise Unlistable(exc.errno, exc.strerror or str(exc), prefix.rstrip("/") or ".") \
            from None
    while folders:
        yield from _enter(dfd, prefix, folders.pop(), depth, skip, max_depth, ordered)


def _names(dfd: int) -> Iterator[str]:
    """The names in folder ``dfd`` as the kernel lists them (``scandir`` keeps its own
    descriptor, closed when the listing ends or the walk is closed)."""
    with os.scandir(dfd) as entries:
        for entry in entries:
            yield entry.name


def _enter(dfd: int, prefix: str, name: str, depth: int, skip: Collection[str],
           max_depth: int | None, ordered: bool) -> Iterator[Entry]:
    rel = prefix + name
    if max_depth is not None and depth > max_depth:
        raise TooDeep(errno.ENAMETOOLONG, f"deeper than {max_depth} folders", rel)
    try:
        sub = open_dir(name, dfd)
    except OSError as exc:
        if exc.errno in GONE:  # swapped for a link or removed since it was listed
            return
        raise Unlistable(exc.errno, exc.strerror or str(exc), rel) from None
    try:
        yield from _walk(sub, rel + "/", depth + 1, skip, max_depth, ordered)
    finally:
        os.close(sub)


def write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, replacing it whole: a reader (a CI step uploading it)
    never sees half a file, and an old file is never left looking current. A path that
    cannot be written (a folder, a file where a folder should be: review 16c) is a
    ``UserError`` naming it, and no temporary file is left beside it.

    Raises:
        UserError: the file cannot be written there.
    """
    from choir._core.errors import UserError

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise UserError(f"cannot write {path}: {exc.strerror or exc}\n"
                        "  fix: give the path of a file in a folder you can write") from None
