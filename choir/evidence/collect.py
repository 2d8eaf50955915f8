"""Collecting a run folder as evidence: every file hashed, nothing followed, all of it bounded.

The run folder holds Choir's logs and the step's ``$CHOIR_OUT`` (``out/``), which a hostile
step wrote. It is walked through ``choir._core.fsopen`` (no link followed, folders entered
by descriptor), symlinks and special files are removed, and each regular file is stored
as an object.

Bytes are capped while the step runs (``limits.out_mb``) and counted again here, by
descriptor, as the walk that stores them sees them (review 21b: folders nested past PATH_MAX
hid 54 MiB from a watchdog walking by path). What is capped here besides: how many files
``out/`` holds, how deep it nests, and how long their names are in all. Every file is listed
in the run manifest, whose hash an attestation signs, so without these bounds 200,000 empty
files made a manifest and an attestation too large for Choir to read back. Over a bound,
``out/`` is moved out of the run folder unread (one rename, whatever its depth), then
removed (``remove_tree``), and the run names the bound that was exceeded: the step FAILs on
it, as it would on the byte cap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from choir._core import fsopen

MANIFEST = "manifest.json"
OUT = "out"
# the most a configuration may allow (``Limits.out_files``/``out_depth`` stay below): a
# manifest listing that many files stays under the 4 MiB Choir reads back
MAX_FILES = 20_000
MAX_DEPTH = 128
MAX_NAME_BYTES = 2 << 20
_SWAPPED = {errno.ELOOP, errno.EINVAL, errno.ENOENT, errno.ENOTDIR}


@dataclass(frozen=True)
class OutBounds:
    """How much ``$CHOIR_OUT`` may hold beyond its bytes: files, nesting, name bytes."""

    files: int = MAX_FILES
    depth: int = MAX_DEPTH
    name_bytes: int = MAX_NAME_BYTES
    mb: int | None = None  # ``limits.out_mb``; None: bytes are not counted here


@dataclass(frozen=True)
class Sealed:
    """A collected run folder: relative path -> digest, and the bound ``out/`` exceeded."""

    files: dict[str, str] = field(default_factory=dict)
    exceeded: str | None = None


def _over(out: Path, bounds: OutBounds) -> str | None:
    """Why ``out`` exceeds ``bounds`` (counted without reading a byte), or None.

    Bytes are the larger of apparent size and blocks of every entry the walk visits, as the
    sandbox's watchdog counts them. A folder below ``out`` that cannot be listed is over
    (fail closed): what it holds is unknown.
    """
    count = names = size = 0
    cap = None if bounds.mb is None else bounds.mb << 20
    try:
        for entry in fsopen.walk(out, max_depth=bounds.depth):
            if not entry.rel.isascii():
                try:  # a name no record can hold as it is (signed, audited): set aside
                    entry.rel.encode("utf-8")  # whole, never stored replaced (review 16e)
                except UnicodeEncodeError:
                    return "$CHOIR_OUT holds a file or folder name that is not UTF-8"
            size += max(entry.st.st_size, entry.st.st_blocks * 512)
            if cap is not None and size > cap:
                return f"$CHOIR_OUT holds more than {bounds.mb} MiB (limits.out_mb exceeded)"
            if stat.S_ISDIR(entry.st.st_mode):
                continue
            count += 1
            names += len(entry.rel.encode("utf-8", "surrogateescape")) + len(OUT) + 1
            if count > bounds.files:
                return f"$CHOIR_OUT holds more than {bounds.files} files (limits.out_files)"
            if names > bounds.name_bytes:
                return (f"$CHOIR_OUT's file names take more than {bounds.name_bytes} bytes "
                        "in all")
    except fsopen.TooDeep:
        return f"$CHOIR_OUT nests folders deeper than {bounds.depth} folders (limits.out_depth)"
    except OSError as exc:
        if exc.errno in _SWAPPED:  # no out/, or not a folder: the walk below removes it
            return None
        return f"$CHOIR_OUT holds a folder that cannot be listed ({exc.strerror or exc})"
    return None


def set_aside(path: Path, aborted: Path) -> Path:
    """Move ``path`` under ``aborted`` (one rename: no depth or size makes it fail); the
    new place."""
    aborted.mkdir(parents=True, exist_ok=True)
    aside = aborted / f"{path.parent.name}.{path.name}.{time.time_ns()}"
    os.rename(path, aside)
    return aside


def discard(path: Path, aborted: Path) -> None:
    """Remove the folder ``path`` without following links, at any depth (``remove_tree``);
    ``aborted`` is kept for callers, nothing is set aside there any more."""
    del aborted
    remove_tree(path)


def _drop(path: Path, aborted: Path) -> None:
    """Take an ``out/`` over its bounds out of the run folder, then remove it.

    Removed, not kept: it is not evidence (nothing in it was read, listed or attested), and
    kept it cost the host without end what the bounds exist to refuse (a step over
    ``limits.out_files`` left 4 million inodes a run under ``aborted/``: review 21b). The
    rename first takes it out of the run folder at once, whatever its size; what cannot be
    removed (a folder its owner made unreadable, met without root) stays under ``aborted/``.
    """
    remove_tree(set_aside(path, aborted))


def remove_tree(path: Path) -> bool:
    """Remove ``path`` and all it holds by descriptor, never following a link; True when
    it is gone. A link or file at ``path`` is unlinked (a link's target is left alone).

    A step shapes this tree: ``shutil.rmtree`` recurses (a ``RecursionError`` past about a
    thousand levels) and a walk by path fails past PATH_MAX. So the tree is flattened: each
    folder found in ``path`` is emptied by moving its subfolders up into ``path`` (one
    ``rename`` each) and unlinking the rest, then removed. Three descriptors and
    ``_BATCH`` names are held at any time, whatever the depth or width.
    """
    try:
        parent = fsopen.open_dir(path.parent)
    except OSError:
        return not os.path.lexists(path)
    try:
        try:
            top = fsopen.open_dir(path.name, parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                os.unlink(path.name, dir_fd=parent)
                return True
            return exc.errno == errno.ENOENT
        try:
            _empty(top)
        finally:
            os.close(top)
        os.rmdir(path.name, dir_fd=parent)
        return True
    except OSError:
        return False
    finally:
        os.close(parent)


_BATCH = 1024
_TAKEN = {errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR, errno.EINVAL}


def _empty(top: int) -> None:
    """Remove everything in folder ``top`` (see ``remove_tree``).

    Every name handled is gone afterwards or an error is raised, so each pass shrinks the
    tree and the loop ends.
    """
    moved = 0
    while batch := _names(top):
        for name in batch:
            try:
                st = os.stat(name, dir_fd=top, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=top)
                continue
            sub = fsopen.open_dir(name, top)
            try:
                while inner := _names(sub):
                    for child in inner:
                        try:
                            kind = os.stat(child, dir_fd=sub, follow_symlinks=False).st_mode
                        except FileNotFoundError:
                            continue
                        if not stat.S_ISDIR(kind):
                            os.unlink(child, dir_fd=sub)
                            continue
                        while True:  # up into top under a free name
                            moved += 1
                            try:
                                os.rename(child, f".choir-rm.{moved}", src_dir_fd=sub,
                                          dst_dir_fd=top)
                                break
                            except OSError as exc:
                                if exc.errno not in _TAKEN:
                                    raise
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=top)


def _names(fd: int) -> list[str]:
    """Up to ``_BATCH`` names in folder ``fd`` (never the whole of a huge folder)."""
    with os.scandir(fd) as entries:
        return [entry.name for _, entry in zip(range(_BATCH), entries, strict=False)]


def seal(base: Path, bounds: OutBounds, aborted: Path,
         ingest: Callable[[int, str], str]) -> Sealed:
    """Collect run folder ``base``: ``ingest(dir_fd, name)`` stores each regular file.

    ``manifest.json`` (and its temp files) are skipped; links and special files are
    removed. When ``out/`` exceeds ``bounds`` it is moved under ``aborted`` and removed
    first (``_drop``), and none of it is listed.
    """
    exceeded = _over(base / OUT, bounds)
    if exceeded:
        _drop(base / OUT, aborted)
    files: dict[str, str] = {}
    try:
        _collect(base, bounds, ingest, files)
    except fsopen.TooDeep:  # out/ grew deeper after it was counted (a process left behind)
        _drop(base / OUT, aborted)
        files = {rel: d for rel, d in files.items() if not rel.startswith(f"{OUT}/")}
        exceeded = f"$CHOIR_OUT nests folders deeper than {bounds.depth} folders " \
                   "(limits.out_depth)"
    return Sealed(files=dict(sorted(files.items())), exceeded=exceeded)


def _collect(base: Path, bounds: OutBounds, ingest: Callable[[int, str], str],
             files: dict[str, str]) -> None:
    for entry in fsopen.walk(base, max_depth=bounds.depth + 1):
        if stat.S_ISDIR(entry.st.st_mode):
            continue
        if entry.rel == MANIFEST or ("/" not in entry.rel and
                                     entry.name.startswith(f".{MANIFEST}.")):
            continue
        try:
            if stat.S_ISREG(entry.st.st_mode):
                files[entry.rel] = ingest(entry.dir_fd, entry.name)
                continue
        except OSError as exc:
            if exc.errno not in _SWAPPED:
                raise
        with contextlib.suppress(FileNotFoundError):  # a link, a special file: not evidence
            os.unlink(entry.name, dir_fd=entry.dir_fd)
