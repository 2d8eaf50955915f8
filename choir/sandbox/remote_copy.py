"""Moving trees in and out of a container through the Docker API, for a remote engine.

A remote engine (``DOCKER_HOST=tcp://...`` or ``ssh://...``) cannot see this machine's
folders, so the docker backend's ``copy`` transfer sends the sealed snapshot in as a tar
(``put_archive``) and takes ``$CHOIR_OUT`` back as a tar (``get_archive``). What comes back
was written by the step, so it is treated as hostile:

* member names that are absolute, contain ``..`` or leave the output folder are refused;
* symlinks, hard links, devices and FIFOs are never created on the host (each is noted in
  the step log instead): a link to ``/etc/shadow`` left by a step stays in the container;
* at most ``cap`` bytes of file data are written (``Limits.out_mb``), and at most ``files``
  files and as many other members (folders, refused ones): an empty file costs an inode and
  no bytes (``Limits.out_files``, review 21b); past either the copy stops and the step is
  marked as stopped by the cap, never PASS;
* files are created with ``O_NOFOLLOW | O_EXCL`` under folders made here, owned by us, with
  no set-id bits, so nothing on the host is overwritten or handed to anyone.

Both directions stream through temporary files / the HTTP response: a large tree is never
held in memory.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from choir.sandbox.base import OUT_FILES

CHUNK = 1 << 16


def pack_tree(root: Path, fh: IO[bytes], *, uid: int, gid: int, writable: bool,
              name: str) -> None:
    """Write ``root`` to ``fh`` as an uncompressed tar whose top folder is ``name``.

    The top folder is a member of its own (the engine ignores ``.``), so extracting into the
    parent of a volume's mount point gives the volume's root this owner and mode.

    Links are stored as links, never followed. Every member is owned by ``uid:gid``;
    ``writable=False`` (the repo) leaves only read/execute bits, so the unprivileged step
    user cannot change it even before the read-only mount applies. Special files are skipped.
    """
    with tarfile.open(fileobj=fh, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        top = tarfile.TarInfo(name)
        top.type, top.uid, top.gid = tarfile.DIRTYPE, uid, gid
        top.mode = 0o755 if writable else 0o555
        tar.addfile(top)
        stack = [root]
        while stack:
            folder = stack.pop()
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)
                        or stat.S_ISLNK(st.st_mode)):
                    continue
                info = tar.gettarinfo(entry.path,
                                      arcname=f"{name}/{os.path.relpath(entry.path, root)}")
                info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
                mode = info.mode & 0o755
                if info.isdir():
                    mode |= 0o555
                elif info.isfile():
                    mode |= 0o444
                info.mode = mode if writable else mode & 0o555
                if info.isfile():
                    with open(entry.path, "rb") as data:  # a regular file, checked above
                        tar.addfile(info, data)
                else:
                    tar.addfile(info)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(Path(entry.path))


@dataclass
class Unpacked:
    """What ``unpack_out`` wrote, and what it refused."""

    files: int = 0
    bytes: int = 0
    exceeded: bool = False
    refused: list[str] = field(default_factory=list)


class _ChunkReader:
    """A read-only file over an iterator of byte chunks (the API's streamed response)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it: Iterator[bytes] = iter(chunks)
        self._buf = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buf) < size:
            try:
                self._buf += next(self._it)
            except StopIteration:
                break
        if size < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:size], self._buf[size:]
        return out


def safe_relative(name: str, prefix: str) -> PurePosixPath | None:
    """``name`` below ``prefix`` as a clean relative path; None when it is not one.

    Refused: absolute names, any ``..`` component, names outside ``prefix``. ``prefix``
    itself yields ``PurePosixPath('.')``.
    """
    if name.startswith("/") or "\\" in name or "\x00" in name:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts or not parts or parts[0] != prefix:
        return None
    return PurePosixPath(*parts[1:]) if len(parts) > 1 else PurePosixPath(".")


def clear_folder(folder: Path) -> None:
    """Remove everything inside ``folder`` without following any link."""
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def unpack_out(chunks: Iterable[bytes], dest: Path, *, prefix: str, cap: int,
               files: int = OUT_FILES) -> Unpacked:
    """Extract the tar stream ``chunks`` (members under ``prefix/``) into ``dest``.

    ``files`` bounds the regular files written and, apart, every other member (folders made,
    members refused), as the watchdog bounds ``$CHOIR_OUT`` (``OutWatch``).

    ``dest`` must exist and hold nothing the archive names. See the module docstring for what
    is refused. Raises ``tarfile.TarError`` or ``OSError`` for a broken archive; the caller
    treats that as an infrastructure error.
    """
    done = Unpacked()
    others = 0
    with tarfile.open(fileobj=_ChunkReader(chunks), mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            rel = safe_relative(member.name, prefix)
            others += rel is None or not member.isfile()
            if others > files or member.isfile() and rel is not None and done.files >= files:
                done.exceeded = True
                break
            if rel is None:
                done.refused.append(f"{member.name!r}: a name outside the output folder")
                continue
            if member.isdir():
                if rel != PurePosixPath("."):
                    _make_dirs(dest, rel)
                continue
            if not member.isfile():
                kind = ("symlink" if member.issym() else "hard link" if member.islnk()
                        else "device or FIFO")
                target = f" -> {member.linkname!r}" if member.linkname else ""
                done.refused.append(f"{member.name!r}: a {kind}{target}")
                continue
            if done.bytes + member.size > cap:
                done.exceeded = True
                break
            parent = _make_dirs(dest, rel.parent)
            source = tar.extractfile(member)
            assert source is not None  # a regular file
            fd = os.open(parent / rel.name,
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(source, out, CHUNK)
            os.chmod(parent / rel.name, (member.mode & 0o755) | 0o600, follow_symlinks=False)
            done.files += 1
            done.bytes += member.size
    return done


def _make_dirs(dest: Path, rel: PurePosixPath) -> Path:
    """``dest/rel`` as real folders made here; refuses anything in the way that is not one."""
    path = dest
    for part in rel.parts:
        if part == ".":
            continue
        path = path / part
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise OSError(f"{path} exists and is not a folder") from None
    return path
