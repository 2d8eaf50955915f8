"""Collecting a run folder as evidence: every file hashed, nothing followed, all of it bounded.

The run folder holds Choir's logs and the step's ``$CHOIR_OUT`` (``out/``), which a hostile
step wrote. It is walked through ``choir._core.fsopen`` (no link followed, folders entered
by descriptor), symlinks and special files are removed, and each regular file is stored
as an object.

Bytes are capped while the step runs (``limits.out_mb``); what is capped here is the rest: how
many files ``out/`` holds, how deep it nests, and how long their names are in all. Every
file is listed in the run manifest, whose hash an attestation signs, so without these bounds
200,000 empty files made a manifest and an attestation too large for Choir to read back.
Over a bound, ``out/`` is set aside unread (renamed, whatever its depth) and the run names
the bound that was exceeded: the step FAILs on it, as it would on the byte cap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
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


@dataclass(frozen=True)
class Sealed:
    """A collected run folder: relative path -> digest, and the bound ``out/`` exceeded."""

    files: dict[str, str] = field(default_factory=dict)
    exceeded: str | None = None


def _over(out: Path, bounds: OutBounds) -> str | None:
    """Why ``out`` exceeds ``bounds`` (counted without reading a byte), or None."""
    count = names = 0
    try:
        for entry in fsopen.walk(out, max_depth=bounds.depth):
            if not entry.rel.isascii():
                try:  # a name no record can hold as it is (signed, audited): set aside
                    entry.rel.encode("utf-8")  # whole, never stored replaced (review 16e)
                except UnicodeEncodeError:
                    return "$CHOIR_OUT holds a file or folder name that is not UTF-8"
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
    except OSError:  # no out/, or not a folder: the walk below removes what is not one
        return None
    return None


def set_aside(path: Path, aborted: Path) -> None:
    """Move ``path`` under ``aborted`` (one rename: no depth or size makes it fail)."""
    aborted.mkdir(parents=True, exist_ok=True)
    os.rename(path, aborted / f"{path.parent.name}.{path.name}.{time.time_ns()}")


def discard(path: Path, aborted: Path) -> None:
    """Remove the folder ``path`` without following links; one nested too deep to remove
    recursively is set aside under ``aborted`` instead."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        set_aside(path, aborted)


def seal(base: Path, bounds: OutBounds, aborted: Path,
         ingest: Callable[[int, str], str]) -> Sealed:
    """Collect run folder ``base``: ``ingest(dir_fd, name)`` stores each regular file.

    ``manifest.json`` (and its temp files) are skipped; links and special files are
    removed. When ``out/`` exceeds ``bounds`` it is set aside under ``aborted`` first, and
    none of it is listed.
    """
    exceeded = _over(base / OUT, bounds)
    if exceeded:
        set_aside(base / OUT, aborted)
    files: dict[str, str] = {}
    try:
        _collect(base, bounds, ingest, files)
    except fsopen.TooDeep:  # out/ grew deeper after it was counted (a process left behind)
        set_aside(base / OUT, aborted)
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
