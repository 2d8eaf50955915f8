"""The artifact store: content-addressed by blake3, streaming, atomic, write-once.

Layout under the root (``choir._core.paths.artifact_dir()``)::

    objects/ab/cdef...   immutable objects (mode 0444), named by their blake3 hex digest
    runs/{run_id}/       run folders: manifest.json, logs/, ...
    tmp/                 in-progress writes; renamed into objects/ only when complete

A write streams through a hasher into a temp file in ``tmp/`` (same filesystem), is fsynced,
then renamed into place, so a crash never leaves a partial object visible and memory stays
constant at any size. Identical content is stored once.

Every byte here may come from a hostile verifier: digests are validated before they touch a
path, run ids cannot traverse, lines are read in bounded chunks, and a run folder is walked
by descriptor (``choir.evidence.collect``): links, FIFOs and devices planted in it are never
followed, and the files of ``$CHOIR_OUT`` are bounded in number, depth and name bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import blake3

from choir._core import fsopen
from choir._core.canonical import canonical_json, is_hash
from choir._core.paths import artifact_dir
from choir.evidence.collect import MANIFEST as MANIFEST
from choir.evidence.collect import OutBounds, Sealed, discard, seal
from choir.exceptions import IntegrityError, UserError
from choir.models import RunManifest

CHUNK = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def _hasher() -> blake3.blake3:
    return blake3.blake3(max_threads=1)


def _open_regular(path: Path, *, follow: bool = True) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file (a FIFO would block forever)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IntegrityError(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _hash_fh(fh: BinaryIO) -> str:
    hasher = _hasher()
    for chunk in iter(lambda: fh.read(CHUNK), b""):
        hasher.update(chunk)
    return hasher.hexdigest()


def hash_file(path: Path) -> str:
    """blake3 hex of a regular file, streaming in constant memory."""
    with _open_regular(path) as fh:
        return _hash_fh(fh)


def _chunks(stream: BinaryIO) -> Iterator[memoryview | bytes]:
    """Read ``stream`` in chunks of at most ``CHUNK`` bytes, reusing one buffer when it can.

    An OS pipe (a verifier's stdout) is widened to ``CHUNK`` where Linux allows, so the
    writer wakes us less often. Each yielded view is valid only until the next is requested.
    """
    with contextlib.suppress(AttributeError, OSError, ValueError):
        fd = stream.fileno()
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, CHUNK)
    readinto = getattr(stream, "readinto", None)
    if readinto is None:
        yield from iter(lambda: stream.read(CHUNK), b"")
        return
    buf = memoryview(bytearray(CHUNK))
    while n := readinto(buf):
        yield buf[:n]


def _iter_line_pieces(fh: BinaryIO, first: int = 1) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, piece)`` in chunks of at most ``CHUNK`` bytes, from line
    ``first`` on (the lines before it are counted a chunk at a time, not one by one).

    A line is the bytes up to and including ``\\n`` (the last line may lack one). Splitting
    long lines into pieces keeps memory flat even for a 1 GiB file without a newline.
    """
    number = 1
    for chunk in iter(lambda: fh.read(CHUNK), b""):
        start = 0
        if number < first:
            ends = chunk.count(b"\n")
            if number + ends < first:
                number += ends
                continue
            # past the newline that ends line first - 1
            start = next(islice(re.finditer(b"\n", chunk), first - number - 1, None)).end()
            number = first
        while True:
            cut = chunk.find(b"\n", start)
            if cut < 0:
                if start < len(chunk):
                    yield number, chunk[start:]
                break
            yield number, chunk[start : cut + 1]
            number += 1
            start = cut + 1


def write_once(path: Path, data: bytes, conflict: str, tmp: Path | None = None) -> None:
    """Write ``data`` to ``path`` atomically and read-only, exactly once.

    The bytes land in a temp file (fsynced, mode 0444; ``tmp``, on the same filesystem, or
    a dotted name beside ``path``) and are linked into place, which fails if the name
    exists, so two writers can never interleave. Writing the same bytes again is a no-op.
    A writer killed after the link leaves its temp behind: pass ``tmp`` where a stray file
    beside ``path`` would be a finding (a run folder lists exactly its files).

    Raises:
        IntegrityError: ``path`` already holds other bytes (message: ``conflict``).
    """
    write_all_once([(path, data, conflict, tmp)])


def write_all_once(files: Sequence[tuple[Path, bytes, str, Path | None]]) -> None:
    """``write_once`` of files that belong together (a session's manifest and its seal):
    every temp written and fsynced first, then the links made back to back, in order, then
    each folder fsynced once. A writer killed between two of them leaves the first without
    the second only in the gap between two ``link`` calls, not across a write and an fsync.

    Raises:
        IntegrityError: a path already holds other bytes (its message; the paths after it
            are not linked).
    """
    temps: list[Path] = []
    try:
        for path, data, _conflict, tmp in files:
            temps.append(tmp or path.with_name(f".{path.name}.{os.getpid()}-"
                                               f"{secrets.token_hex(8)}"))
            with open(temps[-1], "xb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(temps[-1], 0o444)
        for (path, data, conflict, _tmp), made in zip(files, temps, strict=True):
            try:
                os.link(made, path)
            except FileExistsError:
                if path.read_bytes() != data:
                    raise IntegrityError(conflict) from None
        for folder in dict.fromkeys(path.parent for path, *_rest in files):
            _fsync_dir(folder)
    finally:
        for made in temps:
            made.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


STALE_GRACE_S = 600.0  # a dead writer's temp is left this long when cleared in passing
STALE_MAX_S = 86400.0  # and any temp this old, whoever named it


def remove_stale(root: Path, rel: str, *, max_age_s: float, grace_s: float = 0.0) -> int:
    """Remove the temp files in the folder ``rel`` under ``root`` that no live writer will
    link; how many.

    A temp is named ``KIND-PID-HEX`` by its writer: it is stale when that pid is gone and it
    is older than ``grace_s`` (a writer in another pid namespace, whose pid means nothing
    here, is spared while it keeps writing), or when it is older than ``max_age_s``, or when
    it is named otherwise (a pid part that is no pid included) and older than ``grace_s``.
    Only regular files are removed.

    The folder is reached from ``root`` one component at a time, no link followed
    (``choir._core.fsopen``), and listed and cleared by descriptor: whoever can write the
    home could otherwise swap the folder for a link to the user's own files, and each verify
    would delete the ones ten minutes old. A folder that cannot be reached so is left alone.
    """
    removed = 0
    now = time.time()
    try:
        with fsopen.DirCursor(os.path.realpath(root)) as cursor:
            fd = os.dup(cursor.dir(fsopen.split(rel)))
    except OSError:  # missing, or a link or not a folder on the way
        return 0
    try:
        with os.scandir(fd) as found:
            entries = list(found)
        for entry in entries:
            pid = _writer_pid(entry.name)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            age = now - st.st_mtime
            if age > max_age_s or (age > grace_s and (pid is None or not _pid_alive(pid))):
                with contextlib.suppress(OSError):  # gone, or swapped for a folder meanwhile
                    os.unlink(entry.name, dir_fd=fd)
                    removed += 1
    finally:
        os.close(fd)
    return removed


def _writer_pid(name: str) -> int | None:
    """The pid a temp's name gives its writer (``KIND-PID-HEX``), or None: named otherwise,
    or its pid part no pid (not ASCII digits, 0, or past what ``kill`` takes)."""
    parts = name.split("-")
    if len(parts) != 3 or not parts[1].isascii() or not parts[1].isdigit() or \
            len(parts[1]) > 10:
        return None
    pid = int(parts[1])
    return pid if 0 < pid < 2 ** 31 else None


class ArtifactWriter:
    """Streams bytes into the store; ``digest`` is set once the context exits cleanly.

    Leaving the context with an exception stores nothing and removes the temp file.
    """

    def __init__(self, store: ArtifactStore) -> None:
        self._store = store
        self._hash = _hasher()
        self._tmp = store._tmp_path("w")
        self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.size = 0
        self.digest: str | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` to the object being written (unbuffered: no extra copy)."""
        self._hash.update(data)
        view = memoryview(data).cast("B")
        self.size += view.nbytes
        while view:
            view = view[os.write(self._fd, view) :]

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            try:
                if exc_type is None:
                    os.fsync(self._fd)
            finally:
                os.close(self._fd)
            if exc_type is None:
                digest = self._hash.hexdigest()
                try:
                    self._store._commit(self._tmp, digest)
                except FileNotFoundError:
                    raise IntegrityError(
                        f"temp file {self._tmp.name} vanished before commit (gc_tmp?)"
                    ) from None
                self.digest = digest
        finally:
            self._tmp.unlink(missing_ok=True)


class ArtifactStore:
    """Content-addressed storage for raw verifier output, reports and manifests."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or artifact_dir()).expanduser()
        for sub in ("objects", "runs", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # -- writing ---------------------------------------------------------------------------
    def writer(self) -> ArtifactWriter:
        """A context manager that stores what is written to it (the pipeline streams into it)."""
        return ArtifactWriter(self)

    def ingest_stream(self, stream: BinaryIO) -> str:
        """Store everything ``stream`` yields, in constant memory; returns the digest."""
        with self.writer() as w:
            for chunk in _chunks(stream):
                w.write(chunk)
        assert w.digest is not None
        return w.digest

    def ingest_bytes(self, data: bytes) -> str:
        """Store ``data``; returns its digest."""
        with self.writer() as w:
            w.write(data)
        assert w.digest is not None
        return w.digest

    def ingest_file(self, path: Path, *, link: bool = True) -> str:
        """Store a finished regular file and make the source read-only.

        With ``link`` the file is hard-linked into ``objects/`` instead of copied (the bytes
        are written once). The linked inode is taken over first (owner set to us where we
        may, mode 0444) and hashed only afterwards, so a writer still holding the file cannot
        change the object behind its name. Across filesystems, or when the inode cannot be
        taken over, the file is copied instead.

        Raises:
            IntegrityError: ``path`` is not a regular file.
        """
        if link:
            digest = self._ingest_by_link(Path(path))
            if digest is not None:
                return digest
        with _open_regular(Path(path)) as fh:
            digest = self.ingest_stream(fh)
        with contextlib.suppress(OSError):
            os.chmod(path, 0o444)
        return digest

    def ingest_at(self, dir_fd: int, name: str) -> str:
        """Store the regular file ``name`` of folder ``dir_fd`` as ``ingest_file`` does, reached
        without following a link (``choir._core.fsopen``): for files a hostile step wrote.

        Raises:
            OSError: ``name`` is a symlink (``ELOOP``), not a regular file (``EINVAL``) or gone.
        """
        digest = self._ingest_by_link(name, dir_fd)
        if digest is not None:
            return digest
        fd, _st = fsopen.open_regular(name, dir_fd)
        with os.fdopen(fd, "rb") as fh:
            digest = self.ingest_stream(fh)
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o444)
        return digest

    def _ingest_by_link(self, path: Path | str, dir_fd: int | None = None) -> str | None:
        if not stat.S_ISREG(os.lstat(path, dir_fd=dir_fd).st_mode):
            return None  # symlinks and special files are copied (or refused) by the caller
        tmp = self._tmp_path("l")
        try:
            os.link(path, tmp, src_dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None
        try:
            uid = os.geteuid()
            if os.lstat(tmp).st_uid != uid:
                os.chown(tmp, uid, os.getegid(), follow_symlinks=False)
            os.chmod(tmp, 0o444, follow_symlinks=False)
            with _open_regular(tmp, follow=False) as fh:
                digest = _hash_fh(fh)
            self._commit(tmp, digest)
            return digest
        except OSError:
            return None
        finally:
            tmp.unlink(missing_ok=True)

    def _tmp_path(self, kind: str) -> Path:
        """A new temp's name in ``tmp/``, which must be the store's own folder: one swapped
        for a link would have every artifact written through it, into someone's folder.

        Raises:
            IntegrityError: ``tmp/`` is a link, or not a folder.
        """
        folder = self.root / "tmp"
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise IntegrityError(f"{folder} is not a folder of the store (a link, or a file)\n"
                                 "  fix: remove it; the store makes its own")
        return folder / f"{kind}-{os.getpid()}-{secrets.token_hex(8)}"

    def _commit(self, tmp: Path, digest: str) -> None:
        """Move a complete temp file into place, or drop it when the object exists."""
        target = self.path_of(digest)
        if target.exists():
            return  # deduplicated; the caller removes tmp
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o444)
        # Two writers of the same bytes may race here: rename is atomic and both files hold
        # identical content, so whichever lands last is equally correct.
        os.replace(tmp, target)
        _fsync_dir(target.parent)

    def gc_tmp(self, max_age_s: float = 3600.0) -> int:
        """Remove temp files left by crashed writers (``remove_stale``); how many."""
        return remove_stale(self.root, "tmp", max_age_s=max_age_s)

    # -- reading ---------------------------------------------------------------------------
    def path_of(self, digest: str) -> Path:
        """Where the object ``digest`` lives.

        Raises:
            IntegrityError: ``digest`` is not a hex blake3 digest (it could escape the root).
        """
        if not isinstance(digest, str) or not is_hash(digest):
            raise IntegrityError(f"not a blake3 digest: {str(digest)[:80]!r}")
        return self.root / "objects" / digest[:2] / digest[2:]

    def exists(self, digest: str) -> bool:
        """True when the object is stored (its content is not re-checked: see ``verify``)."""
        return isinstance(digest, str) and is_hash(digest) and self.path_of(digest).is_file()

    def open(self, digest: str) -> BinaryIO:
        """Open a stored object for reading.

        Raises:
            IntegrityError: bad digest, or the object is missing or not a regular file.
        """
        self.path_of(digest)  # the digest checked
        try:  # from the store's root, no link followed on the way (the broker reads here)
            with fsopen.DirCursor(self.root) as cursor:
                fd, _st = fsopen.open_regular(digest[2:], cursor.dir(("objects", digest[:2])))
            return os.fdopen(fd, "rb")
        except FileNotFoundError:
            raise IntegrityError(f"artifact {digest} is missing") from None
        except OSError as err:
            raise IntegrityError(f"artifact {digest} is unreadable: {err}") from None

    def read_bytes(self, digest: str, limit: int | None = None) -> bytes:
        """The object's bytes, or its first ``limit`` bytes."""
        with self.open(digest) as fh:
            return fh.read() if limit is None else fh.read(limit)

    def _span(self, digest: str, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        if start < 1 or end < start:
            raise UserError(f"bad line span {start}..{end}: 1-based, start <= end")
        with self.open(digest) as fh:
            for number, piece in _iter_line_pieces(fh, start):
                if number > end:
                    return
                if number >= start:
                    yield number, piece

    def read_lines(self, digest: str, start: int, end: int,
                   line_max: int | None = None) -> list[bytes]:
        """Lines ``start..end`` (1-based, inclusive, newlines kept), read streaming.

        Lines before ``start`` are skipped in bounded chunks, so citing line 10 million of a
        huge log costs no more memory than the cited lines themselves; with ``line_max``
        each line is cut to its first ``line_max`` bytes while reading, so a cited 1 GiB
        line costs ``line_max`` bytes.
        """
        lines: list[bytes] = []
        current = 0
        for number, piece in self._span(digest, start, end):
            if number != current:
                lines.append(piece if line_max is None else piece[:line_max])
                current = number
            elif line_max is None:
                lines[-1] += piece
            elif len(lines[-1]) < line_max:
                lines[-1] += piece[:line_max - len(lines[-1])]
        return lines

    def span_hash(self, digest: str, start: int, end: int) -> str:
        """The hash a citation carries for lines ``start..end`` of an artifact.

        Defined as the hex blake3 of the exact bytes of those lines, concatenated, newlines
        included (the last line of a file may have none). Lines past the end contribute
        nothing, so a span beyond the file hashes like the part that exists. Streaming.
        """
        hasher = _hasher()
        for _number, piece in self._span(digest, start, end):
            hasher.update(piece)
        return hasher.hexdigest()

    def verify(self, digest: str) -> bool:
        """Re-hash the stored object; False when it is missing, unreadable or altered."""
        try:
            with self.open(digest) as fh:
                return _hash_fh(fh) == digest
        except (OSError, IntegrityError):
            return False

    def iter_objects(self) -> Iterator[str]:
        """Digests of every stored object (names that are not digests are skipped)."""
        objects = self.root / "objects"
        for sub in sorted(objects.iterdir()):
            if len(sub.name) == 2 and sub.is_dir():
                for entry in sorted(sub.iterdir()):
                    if is_hash(sub.name + entry.name):
                        yield sub.name + entry.name

    # -- run folders -----------------------------------------------------------------------
    def run_dir(self, run_id: str) -> Path:
        """The folder of a run (not created).

        Raises:
            UserError: ``run_id`` is not ``^[A-Za-z0-9][A-Za-z0-9._-]*$`` or holds ``..``.
        """
        if not isinstance(run_id, str) or not _RUN_ID.match(run_id) or ".." in run_id:
            raise UserError(f"invalid run id {run_id!r}: use letters, digits, '.', '_', '-'")
        return self.root / "runs" / run_id

    def iter_runs(self) -> Iterator[str]:
        """Ids of the run folders present."""
        for entry in sorted((self.root / "runs").iterdir()):
            if entry.is_dir() and _RUN_ID.match(entry.name):
                yield entry.name

    def seal_run(self, run_id: str) -> dict[str, str]:
        """Hash every file of a run folder but ``manifest.json`` and make each read-only.

        Returns relative posix path -> digest, for ``RunManifest.files``; each file is also
        stored as an object. Nothing is followed: the folder is walked by descriptor, and
        symlinks, FIFOs, sockets and devices that a verifier planted are removed (evidence
        is regular files only). ``out/`` is held to the widest ``OutBounds``; see
        ``collect_run`` for a step's own limits and the bound it exceeded.
        """
        return self.collect_run(run_id, OutBounds()).files

    def collect_run(self, run_id: str, bounds: OutBounds) -> Sealed:
        """``seal_run`` within ``bounds``: over them, ``out/`` is set aside unread and the
        result names the bound (``choir.evidence.collect``)."""
        return seal(self.run_dir(run_id), bounds, self.root / "aborted", self.ingest_at)

    def discard(self, path: Path) -> None:
        """Remove a folder of a run (temporaries, caches) by descriptor, never following a
        link, at any depth (``collect.remove_tree``)."""
        discard(path, self.root / "aborted")

    def sealed(self, run_id: str) -> tuple[RunManifest, str] | None:
        """The manifest of a run that finished and its hash, or None if it never sealed.

        Raises:
            IntegrityError: a manifest is there but does not parse (a tampered run folder).
        """
        path = self.run_dir(run_id) / MANIFEST
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            manifest = RunManifest.model_validate_json(data)
        except ValueError as exc:
            raise IntegrityError(f"run {run_id}: manifest.json does not parse: {exc}") from None
        return manifest, self.ingest_bytes(data)

    def set_aside(self, run_id: str) -> Path | None:
        """Move an unsealed run folder (its process was killed) out of ``runs/``.

        It is not evidence: nothing was attested from it and no manifest lists its files. It
        goes to ``aborted/{run_id}.{time}`` for whoever wants to look, and the run id is free
        again. Returns the new place, or None when there was nothing to move.
        """
        base = self.run_dir(run_id)
        if not base.exists() or (base / MANIFEST).exists():
            return None
        aside = self.root / "aborted" / f"{run_id}.{time.time_ns()}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.rename(base, aside)
        return aside

    def write_manifest(self, run_id: str, manifest: RunManifest) -> str:
        """Write ``runs/{run_id}/manifest.json`` once, atomically, read-only; returns its hash.

        The manifest is canonical JSON and is also stored as an object, so the hash signed
        into an attestation can be re-checked even if the run folder is lost. Writing the
        same manifest again is a no-op.

        Raises:
            IntegrityError: a different manifest is already written for this run.
        """
        data = canonical_json(manifest)
        self.run_dir(run_id).mkdir(parents=True, exist_ok=True)
        self.write_run_file(run_id, MANIFEST, data,
                            f"run {run_id} already has a different manifest")
        return self.ingest_bytes(data)

    def write_run_file(self, run_id: str, name: str, data: bytes, conflict: str) -> None:
        """Write ``runs/{run_id}/{name}`` once (``write_once``), its temp in ``tmp/``: a
        writer killed mid-write leaves nothing in the run folder (``gc_tmp`` clears it)."""
        self.write_run_files(run_id, [(name, data, conflict)])

    def write_run_files(self, run_id: str, files: Sequence[tuple[str, bytes, str]]) -> None:
        """``write_run_file`` of files that belong together, linked back to back
        (``write_all_once``): (name, bytes, conflict message) each."""
        folder = self.run_dir(run_id)
        write_all_once([(folder / name, data, conflict, self._tmp_path("m"))
                        for name, data, conflict in files])
