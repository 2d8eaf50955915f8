"""One pass over a tree: every file git would list, hashed, and (with a sink) sealed.

The scan behind ``choir.evidence.tree``: the paths come from git (or a walk outside git),
every file is reached through ``choir._core.fsopen`` and never through a link, and each
file's bytes are hashed as they are read, into the tree hash, its sha256 twin and the git
blob id that binds a clean commit. Where the bytes go is the sink's business: nowhere
(``inspect_tree``), a plain copy (``CopySink``), or a sealed tree built from the store
(``choir.evidence.sealer``), which may already hold them; the stat cache tells which files
need not be read again (``choir.evidence.statcache``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import blake3

from choir._core import fsopen
from choir.evidence.git import GitRepo, ObjectReader, locate, tree_id
from choir.evidence.statcache import Hashed, StatCache
from choir.evidence.store import MODES, Store
from choir.exceptions import IntegrityError, UserError

_BATCH = 4096  # files whose lstat is taken ahead of the scan, at a time
SKIP_DIRS = frozenset({".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                       ".venv"})  # outside git: folders no tree holds
CHUNK = 1 << 20
# deleted, reachable only through a link, not a regular file any more, or a name no work
# tree can hold (a crafted index listing ``../x``): not a file of this tree
_GONE = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EINVAL}


def _is_file(entry: fsopen.Entry) -> bool:
    """Whether a walked entry is one of the tree's files. A symlink to a folder is not (a
    ``.venv`` link to a virtualenv elsewhere): it is neither entered nor hashed, as a
    walk that never follows links has always treated it. Its target's type is looked up
    only to classify it; nothing is read through it."""
    if stat.S_ISDIR(entry.st.st_mode):
        return False
    if stat.S_ISLNK(entry.st.st_mode):
        try:
            return not stat.S_ISDIR(os.stat(entry.name, dir_fd=entry.dir_fd).st_mode)
        except OSError:  # dangling: a file of the tree, hashed by its target text
            return True
    return True


LIST = ("ls-files", "-z", "--cached", "--others", "--exclude-standard")


def _files(repo: Path, git: GitRepo | None, *, everything: bool = False,
           listing: Callable[[], bytes | None] | None = None) -> list[str]:
    """The paths to hash, sorted: git's listing (``listing``: started already), or
    (outside git) every file found."""
    listed = (listing or (lambda: git.run(*LIST)))() \
        if git is not None and not everything else None
    if listed is not None:
        return sorted({p for p in listed.decode("utf-8", "surrogateescape").split("\0") if p})
    if git is not None and not everything:
        # never a walk in its place: that takes in every file git ignores (a secret.env),
        # into the tree hash and every verifier's snapshot (review 18a F3: a FIFO planted as
        # .gitignore blocked git until its timeout, and the walk followed)
        raise UserError(f"git could not list the files of {repo} (`git ls-files` failed or "
                        "took over 60 s: a FIFO or another special file planted as a "
                        ".gitignore or .git/info/exclude?)\n  fix: run `git status` there, "
                        "and remove what it cannot read")
    skip = frozenset() if everything else SKIP_DIRS
    try:
        if everything:
            return sorted(_every_entry(repo))
        return sorted(e.rel for e in fsopen.walk(repo, skip=skip, max_depth=fsopen.MAX_DEPTH)
                      if _is_file(e))
    except fsopen.TooDeep as exc:
        raise UserError(f"{repo}/{exc.filename} is nested deeper than {fsopen.MAX_DEPTH} folders: "
                        "fix: flatten it, or ignore it in git") from None
    except fsopen.Unlistable as exc:
        raise unlistable(repo, exc) from None


def unlistable(root: Path, exc: fsopen.Unlistable) -> UserError:
    """The error for a folder of a tree Choir cannot list (mode 000 to this user): what it
    holds could be neither hashed nor ruled out, so the tree is refused, never read around."""
    return UserError(f"{root}/{exc.filename} cannot be listed ({exc.strerror}): what it holds "
                     "can be neither hashed nor ruled out\n  fix: make it readable (chmod "
                     "u+rx), or remove it")


class Stray(Exception):
    """A snapshot folder holds what no tree can: a FIFO, a socket, a device (``_holds``)."""


def _every_entry(root: Path) -> Iterator[str]:
    """Every entry of a snapshot folder but its folders, links to folders included (the
    tree hashes each link by its target text, whatever it leads to); a FIFO, socket or
    device raises ``Stray``: a folder holding one is not the tree whose name it has."""
    for entry in fsopen.walk(root, max_depth=fsopen.MAX_DEPTH):
        mode = entry.st.st_mode
        if stat.S_ISDIR(mode):
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise Stray(entry.rel)
        yield entry.rel


@dataclass(frozen=True)
class Snapshot:
    """What one hashing pass saw: the tree hash, its sha256 twin, and the clean commit.

    ``path`` is the read-only copy of exactly the hashed files (None when only hashed).
    ``sha256`` is the sha256 of the same file list as bytes (``tree_manifest``), for in-toto
    consumers that match only sha256. ``commit_sha`` is HEAD only when the tree equals HEAD's tree.
    """

    tree_hash: str
    sha256: str
    commit_sha: str | None
    path: Path | None
    files: int
    size: int


def blob_hasher(oid_len: int, size: int) -> hashlib._Hash:
    hasher = hashlib.sha256() if oid_len == 64 else hashlib.sha1()  # noqa: S324 - git's id
    hasher.update(f"blob {size}\0".encode())
    return hasher


def _outside_link(repo: Path, rel: str, link: str) -> str:
    """The refusal of a symlink out of the tree, with the fix that fits: a virtualenv that
    git does not ignore (its ``bin/python`` links out to the base interpreter) is the common
    case, and the fix there is ``.gitignore``, not the link."""
    top = rel.split("/", 1)[0]
    if "/" in rel and (repo / top / "pyvenv.cfg").is_file():
        return (f"{repo / rel} is a symlink to {link}, outside the repo: {top}/ is a virtualenv "
                f"that git does not ignore, so it is part of the tree to verify; fix: add "
                f"'{top}/' to .gitignore (Choir still runs the project's interpreter from it)")
    if not os.path.isabs(link) and _climbs_after_a_name(link):
        return (f"{repo / rel} is a symlink to {link}, which climbs with '..' after a name: "
                "the name may itself be a link, so it can lead out of the tree a verifier "
                "reads; fix: write the target with every '..' first (e.g. ../pkg/x.py), or "
                "remove it")
    return (f"{repo / rel} is a symlink to {link}, outside the repo: a verifier could follow "
            "it out of the tree it verifies; fix: make it relative and inside the repo, or "
            "remove it")


def _climbs_after_a_name(target: str) -> bool:
    """Whether ``target`` has a ``..`` after a name (``d/../x``): the kernel resolves the
    name first, and it may itself be a link (``d -> .`` one level up, or to the top of the
    tree), so where ``..`` lands is not where the text says."""
    named = False
    for part in target.split("/"):
        if part == "..":
            if named:
                return True
        elif part not in ("", "."):
            named = True
    return False


def _inside(root: Path, link: Path, target: str) -> bool:
    """True when a symlink at ``link`` pointing to ``target`` stays under ``root``.

    Only leading ``..`` may climb: those go up the link's own folders, which the scan
    reached without following a link, so the text says where they land. The names after
    them may be links, each checked so too: by induction every link of the tree resolves
    inside it."""
    if os.path.isabs(target) or _climbs_after_a_name(target):
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    return resolved == str(root) or resolved.startswith(str(root) + os.sep)


class _Sink(Protocol):
    """Where a scan puts the files it hashes: a plain copy (``CopySink``) or a sealed tree
    built from the store (``choir.evidence.sealer.Sealer``)."""

    dedups: bool
    write_first: bool
    git_tree: str

    def known(self, rel: str, parts: list[str], kind: str, digest: bytes, *,
              miss: bool = False) -> bool: ...

    def cached_git_tree(self, tree_hash: str, oid_len: int) -> str | None: ...

    def new_file(self, kind: str) -> tuple[int, str]: ...

    def added(self, rel: str, kind: str, digest: bytes, name: str) -> None: ...

    def symlink(self, rel: str, target: str, digest: bytes) -> None: ...


class CopySink:
    """The copy of every hashed file into ``dest`` in the hashing pass: what every snapshot
    was before the store, and still is where the store cannot be used (another file system,
    ``CHOIR_TREE_STORE=off``) or a built tree failed its check."""

    dedups = False
    write_first = True
    git_tree = ""

    def __init__(self, dest: fsopen.DirCursor) -> None:
        self._dest = dest
        self._parts: list[str] = []

    def known(self, rel: str, parts: list[str], kind: str, digest: bytes, *,
              miss: bool = False) -> bool:
        return False

    def cached_git_tree(self, tree_hash: str, oid_len: int) -> str | None:
        return None

    def at(self, parts: list[str]) -> None:
        self._parts = parts

    def new_file(self, kind: str) -> tuple[int, str]:
        mode = MODES[kind]
        out = fsopen.create_file(self._parts[-1], self._dest.dir(self._parts[:-1]), mode)
        os.fchmod(out, mode)  # whatever the umask: a sandbox user must read it
        return out, self._parts[-1]

    def added(self, rel: str, kind: str, digest: bytes, name: str) -> None:
        pass

    def symlink(self, rel: str, target: str, digest: bytes) -> None:
        parts = rel.split("/")
        os.symlink(target, parts[-1], dir_fd=self._dest.dir(parts[:-1]))


def _hash_fd(src: int, out: int, kind: str, oid_len: int, expected: int) -> Hashed:
    """Stream descriptor ``src`` (closed after) through every hash, and into ``out`` unless
    -1: the bytes hashed are the bytes written."""
    inner, inner256 = blake3.blake3(max_threads=1), hashlib.sha256()
    blob = blob_hasher(oid_len, expected)
    size = 0
    with os.fdopen(src, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            size += len(chunk)
            inner.update(chunk)
            inner256.update(chunk)
            blob.update(chunk)
            if out >= 0:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
    if size != expected:  # changed under us: the blob id header is wrong
        blob = blob_hasher(oid_len, -1)
    return Hashed(kind, inner.digest(), inner256.digest(), blob.digest(), size)


def _kind(st: os.stat_result) -> str:
    return "x" if st.st_mode & 0o111 else "f"


FILE_MB = ("CHOIR_MAX_FILE_MB", 1024)
TREE_MB = ("CHOIR_MAX_TREE_MB", 4096)


def limit_mb(limit: tuple[str, int]) -> int:
    """The limit's value in MiB: its variable's, else its default.

    Raises:
        UserError: the variable is set to no positive whole number.
    """
    var, default = limit
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) <= 0:
        raise UserError(f"{var}={raw!r}: expected a positive whole number of MiB")
    return int(raw)


def _too_big(what: str, limit: tuple[str, int]) -> UserError:
    """A tree's file or whole past a limit: every byte of it would be read, hashed three
    ways and copied into the store at its full size (a sparse file costs its writer
    nothing; review 18a F1: 2 GiB of one cost 46 s and 2 GiB of disk a round)."""
    var, _ = limit
    return UserError(f"{what}, over the limit of {limit_mb(limit)} MiB that Choir seals\n"
                     f"  fix: remove it from the tree or ignore it in git, or raise {var}")


def _read(folder: int, parts: list[str], rel: str, sink: _Sink | None, oid_len: int,
          cache: StatCache | None, file_cap: int) -> Hashed:
    """Hash the regular file ``parts[-1]`` of ``folder``, and put it in ``sink``.

    A sink that may hold the bytes already is asked first (read once to learn the digest,
    again into a new object only when they are new), unless it expects new bytes
    (``write_first``: one read, into a new object). The stat cache records the ``lstat``
    taken before the read whose bytes were kept."""
    fd, st = fsopen.open_regular(parts[-1], folder)
    if st.st_size > file_cap:
        os.close(fd)
        raise _too_big(f"{rel} holds {st.st_size >> 20} MiB", FILE_MB)
    if sink is None or not sink.write_first:
        hashed = _hash_fd(fd, -1, _kind(st), oid_len, st.st_size)
        if sink is not None and not sink.known(rel, parts, hashed.kind, hashed.digest,
                                               miss=True):
            fd, st = fsopen.open_regular(parts[-1], folder)
            hashed = _write(fd, st, rel, sink, oid_len)
    else:
        if isinstance(sink, CopySink):
            sink.at(parts)
        hashed = _write(fd, st, rel, sink, oid_len)
    if cache is not None and hashed.size == st.st_size:
        cache.keep(rel, st, hashed)
    return hashed


def _write(fd: int, st: os.stat_result, rel: str, sink: _Sink, oid_len: int) -> Hashed:
    kind = _kind(st)
    try:
        out, name = sink.new_file(kind)
    except BaseException:
        os.close(fd)
        raise
    try:
        hashed = _hash_fd(fd, out, kind, oid_len, st.st_size)
    finally:
        os.close(out)
    sink.added(rel, kind, hashed.digest, name)
    return hashed


def _head(git: GitRepo, objects: ObjectReader | None = None) -> tuple[str | None, str | None]:
    """``HEAD``'s commit and the tree its (re-hashed) commit object records, from one
    ``git cat-file`` (``objects``: one the caller started early and closes; None, None: no
    commit; (sha, None): its object could not be read back)."""
    try:
        if objects is not None:
            found = objects.head()
        else:
            with git.objects() as started:
                found = started.head()
    except (IntegrityError, OSError, ValueError):
        return git.rev("HEAD"), None
    return found if found is not None else (None, None)


def _clean_commit(head: str | None, recorded: str | None, seen: dict[str, tuple[str, bytes]],
                  ours: str | None = None) -> tuple[str | None, str]:
    """(``head`` when ``recorded``, the tree its commit object records, is exactly the tree
    of ``seen``'s blob ids, else None; that tree's id). Nothing git lists or caches is
    trusted here; ``ours``: the tree id already known for these files."""
    if head is None:
        return None, ""
    ours = ours or tree_id(seen, len(head))
    return (head if recorded is not None and ours == recorded else None), ours


def scan(repo: Path, sink: _Sink | None, manifest: list[bytes] | None = None,
          *, commit: bool = True, everything: bool = False, store: Store | None = None,
          listing: Callable[[], bytes | None] | None = None,
          objects: ObjectReader | None = None) -> Snapshot:
    """One pass over the tree: hash every listed file and, with ``sink``, put it there.

    Every file is reached through ``choir._core.fsopen`` (no link followed on the way); a
    listed path that can only be reached through a symlinked folder is skipped, as git
    itself treats it (deleted from the work tree). With ``store`` the stat cache kept there
    answers for files whose ``lstat`` did not change (``choir.evidence.statcache``), when
    the sink still holds their bytes. ``listing`` and ``objects``: git's listing of the
    tree and a reader of its objects, started by the caller while it prepared.
    """
    repo = repo.resolve()
    git = None if everything else locate(repo)
    head, recorded = _head(git, objects) if commit and git is not None else (None, None)
    oid_len = len(head) if head else 40
    cache = StatCache.of(store.root, repo, oid_len) if store is not None else None
    listed = _files(repo, git, everything=everything, listing=listing)
    ahead = cache is not None and bool(cache)  # lstat a batch ahead (fsopen.lstat_many)
    stats: list[os.stat_result | OSError] = []
    seen: dict[str, tuple[str, bytes]] = {}
    outer, outer256 = blake3.blake3(), hashlib.sha256()
    records: list[bytes] = []
    lines: list[bytes] = []
    files = total = 0
    tree_cap, file_cap = limit_mb(TREE_MB) << 20, limit_mb(FILE_MB) << 20
    with fsopen.DirCursor(repo) as src:
        for i, rel in enumerate(listed):
            if ahead and i % _BATCH == 0:  # a batch at a time: memory stays flat in the tree
                stats = fsopen.lstat_many(repo, listed[i:i + _BATCH])
            try:
                parts = fsopen.split(rel)
                st = stats[i % _BATCH] if ahead else None
                if isinstance(st, OSError):
                    raise st
                hashed = None
                if st is not None and stat.S_ISREG(st.st_mode):
                    assert cache is not None and sink is not None
                    hashed = cache.hit(rel, st)
                    if hashed is not None and \
                            not sink.known(rel, parts, hashed.kind, hashed.digest):
                        hashed = None
                if hashed is None:
                    folder = src.dir(parts[:-1])
                    if st is None:
                        st = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        link = os.readlink(parts[-1], dir_fd=folder)
                    elif stat.S_ISREG(st.st_mode):
                        hashed = _read(folder, parts, rel, sink, oid_len, cache, file_cap)
                    elif everything:
                        raise Stray(rel)
                    else:
                        continue
            except OSError as exc:
                if exc.errno in _GONE:
                    continue
                raise
            if hashed is None:
                hashed = _symlink(repo, rel, parts, link, sink, oid_len)
            kind = hashed.kind
            name = rel.encode("utf-8", "surrogateescape")
            records.append(b"%b %b\0%b" % (kind.encode(), name, hashed.digest))
            lines.append(b"%b %b %b\0" % (kind.encode(), hashed.sha256.hex().encode(), name))
            if len(records) >= 4096:
                _digest(outer, outer256, manifest, records, lines)
            seen[rel] = (kind, hashed.blob)
            files += 1
            total += hashed.size
            if total > tree_cap:
                raise _too_big(f"the tree holds over {total >> 20} MiB", TREE_MB)
    _digest(outer, outer256, manifest, records, lines)
    if cache is not None:
        cache.save()
    digest = outer.hexdigest()
    known = sink.cached_git_tree(digest, oid_len) if sink is not None else None
    clean, ours = _clean_commit(head, recorded, seen, known)
    if sink is not None:
        sink.git_tree = ours
    return Snapshot(tree_hash=digest, sha256=outer256.hexdigest(), commit_sha=clean,
                    path=None, files=files, size=total)


def _digest(outer: blake3.blake3, outer256: hashlib._Hash, manifest: list[bytes] | None,
            records: list[bytes], lines: list[bytes]) -> None:
    """Feed a batch of per-file records to the tree hashes (one call per batch)."""
    outer.update(b"".join(records))
    joined = b"".join(lines)
    outer256.update(joined)
    if manifest is not None:
        manifest.extend(lines)
    records.clear()
    lines.clear()


def _symlink(repo: Path, rel: str, parts: list[str], link: str, sink: _Sink | None,
             oid_len: int) -> Hashed:
    """A symlink is hashed by its target text; one out of the tree is refused in a
    snapshot (a verifier could follow it out)."""
    data = link.encode("utf-8", "surrogateescape")
    blob = blob_hasher(oid_len, len(data))
    blob.update(data)
    hashed = Hashed("l", blake3.blake3(data).digest(), hashlib.sha256(data).digest(),
                    blob.digest(), len(data))
    if sink is not None:
        if not _inside(repo, repo / rel, link):
            raise UserError(_outside_link(repo, rel, link))
        if not sink.known(rel, parts, "l", hashed.digest):
            sink.symlink(rel, link, hashed.digest)
    return hashed


