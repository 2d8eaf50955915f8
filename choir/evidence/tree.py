"""Identify exactly what was verified: a content hash of the working tree, and its commit.

The tree hash covers every file git would track (tracked and untracked-but-not-ignored) with
its mode and contents, so uncommitted changes change the hash. Outside git, every file under
the repo except ``.git`` and caches. Evidence is bound to this hash, so it cannot be reused
for a different tree.

Verifiers never read the live working tree: ``snapshot`` copies exactly the hashed files
into a read-only directory in the same pass that hashes them (the hash is over the bytes
copied), and that directory is what the sandbox sees. Ignored files (a ``conftest.py`` hidden
by ``.git/info/exclude``, a stale ``__pycache__``) are absent from it, and a process left
behind by the executor cannot change it afterwards. A copy, not a
hard link: a hard link would let a leftover process write through to the snapshot.

Every file is opened through ``choir._core.fsopen``, one component at a time and never
through a link: git lists paths from its index, and a staged ``lnk/key`` whose folder was
swapped for a symlink to the signing key's folder must not be copied into the snapshot.

``commit_sha`` is recorded only when the tree HEAD's commit object records (its bytes
re-hashed, replace refs and grafts off: ``choir.evidence.git``) equals the git tree id
computed here from the copied bytes, so a commit is never named for a tree that had
uncommitted changes, nor for a tree that git was made to show in its place.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import blake3

from choir._core import fsopen
from choir._core.paths import artifact_dir
from choir.evidence.git import GitRepo, locate, tree_id
from choir.exceptions import IntegrityError, UserError

_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv"}
_CHUNK = 1 << 20
_MAX_DEPTH = 256
# deleted, reachable only through a link, not a regular file any more, or a name no work
# tree can hold (a crafted index listing ``../x``): not a file of this tree
_GONE = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EINVAL}


def resolve_commit(repo: Path, rev: str) -> str | None:
    """The full sha of commit ``rev`` in ``repo``, or None."""
    git = locate(repo)
    return git.rev(rev) if git is not None else None


def commit_sha(repo: Path) -> str | None:
    """HEAD's sha, or None outside git or before the first commit."""
    return resolve_commit(repo, "HEAD")


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


def _files(repo: Path, git: GitRepo | None, *, everything: bool = False) -> list[str]:
    """The paths to hash, sorted: git's listing, or (outside git) every file found."""
    listed = git.run("ls-files", "-z", "--cached", "--others", "--exclude-standard") \
        if git is not None and not everything else None
    if listed is not None:
        return sorted({p for p in listed.decode("utf-8", "surrogateescape").split("\0") if p})
    skip = frozenset() if everything else _SKIP_DIRS
    try:
        return sorted(e.rel for e in fsopen.walk(repo, skip=skip, max_depth=_MAX_DEPTH)
                      if _is_file(e))
    except fsopen.TooDeep as exc:
        raise UserError(f"{repo}/{exc.filename} is nested deeper than {_MAX_DEPTH} folders: "
                        "fix: flatten it, or ignore it in git") from None


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


def _blob_hasher(oid_len: int, size: int) -> hashlib._Hash:
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
    return (f"{repo / rel} is a symlink to {link}, outside the repo: a verifier could follow "
            "it out of the tree it verifies; fix: make it relative and inside the repo, or "
            "remove it")


def _inside(root: Path, link: Path, target: str) -> bool:
    """True when a symlink at ``link`` pointing to ``target`` stays under ``root``."""
    if os.path.isabs(target):
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    return resolved == str(root) or resolved.startswith(str(root) + os.sep)


def _copy_file(src: int, out: int, hashers: list[object]) -> int:
    """Stream descriptor ``src`` into every hasher (and ``out`` unless -1); returns the size."""
    size = 0
    with os.fdopen(src, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            size += len(chunk)
            for h in hashers:
                h.update(chunk)  # type: ignore[attr-defined]
            if out >= 0:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
    return size


def _clean_commit(git: GitRepo | None, head: str | None,
                  seen: dict[str, tuple[str, str]]) -> str | None:
    """``head`` when the tree its (re-hashed) commit object records is exactly the tree of
    ``seen``'s blob ids; otherwise None. Nothing git lists or caches is trusted here."""
    if git is None or head is None:
        return None
    try:
        with git.objects() as objects:
            recorded = objects.commit_tree(head)
    except (IntegrityError, OSError, ValueError):
        return None
    return head if tree_id(seen, len(head)) == recorded else None


def _scan(repo: Path, dest: Path | None, manifest: list[bytes] | None = None,
          *, commit: bool = True, everything: bool = False) -> Snapshot:
    """One pass over the tree: hash every listed file and, with ``dest``, copy it there.

    Every file is reached through ``choir._core.fsopen`` (no link followed on the way); a
    listed path that can only be reached through a symlinked folder is skipped, as git
    itself treats it (deleted from the work tree).
    """
    repo = repo.resolve()
    git = None if everything else locate(repo)
    head = git.rev("HEAD") if commit and git is not None else None
    oid_len = len(head) if head else 40
    seen: dict[str, tuple[str, str]] = {}
    outer, outer256 = blake3.blake3(), hashlib.sha256()
    files = total = 0
    with contextlib.ExitStack() as stack:
        src = stack.enter_context(fsopen.DirCursor(repo))
        dst = stack.enter_context(fsopen.DirCursor(dest, create=True)) if dest else None
        for rel in _files(repo, git, everything=everything):
            try:
                parts = fsopen.split(rel)
                folder = src.dir(parts[:-1])
                st = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    link = os.readlink(parts[-1], dir_fd=folder)
                    fd = -1
                elif stat.S_ISREG(st.st_mode):
                    fd, st = fsopen.open_regular(parts[-1], folder)
                else:
                    continue
            except OSError as exc:
                if exc.errno in _GONE:
                    continue
                raise
            inner, inner256 = blake3.blake3(max_threads=1), hashlib.sha256()
            out_dir = dst.dir(parts[:-1]) if dst is not None else -1
            if fd < 0:
                data = link.encode("utf-8", "surrogateescape")
                if dst is not None:
                    if not _inside(repo, repo / rel, link):
                        raise UserError(_outside_link(repo, rel, link))
                    os.symlink(link, parts[-1], dir_fd=out_dir)
                blob = _blob_hasher(oid_len, len(data))
                for h in (inner, inner256, blob):
                    h.update(data)
                kind, size = "l", len(data)
            else:
                blob = _blob_hasher(oid_len, st.st_size)
                kind = "x" if st.st_mode & 0o111 else "f"
                mode = 0o555 if kind == "x" else 0o444
                out = fsopen.create_file(parts[-1], out_dir, mode) if dst is not None else -1
                try:
                    if out >= 0:
                        os.fchmod(out, mode)  # whatever the umask: a sandbox user must read it
                    size = _copy_file(fd, out, [inner, inner256, blob])
                finally:
                    if out >= 0:
                        os.close(out)
                if size != st.st_size:  # changed under us: the blob id header is wrong
                    blob = _blob_hasher(oid_len, -1)
            record = f"{kind} {rel}\0".encode("utf-8", "surrogateescape")
            outer.update(record)
            outer.update(inner.digest())
            line = f"{kind} {inner256.hexdigest()} {rel}\0".encode("utf-8", "surrogateescape")
            outer256.update(line)
            if manifest is not None:
                manifest.append(line)
            seen[rel] = (kind, blob.hexdigest())
            files += 1
            total += size
    return Snapshot(tree_hash=outer.hexdigest(), sha256=outer256.hexdigest(),
                    commit_sha=_clean_commit(git, head, seen), path=dest,
                    files=files, size=total)


def tree_hash(repo: Path) -> str:
    """Hex blake3 over (path, mode, content hash) of every file in the working tree."""
    return _scan(repo, None, commit=False).tree_hash


def tree_manifest(repo: Path) -> bytes:
    """The tree's canonical manifest: ``KIND SHA256 PATH\\0`` per file, in path order.

    KIND is ``f`` (file), ``x`` (executable) or ``l`` (symlink; its target is hashed). Its
    sha256 is the tree subject's ``sha256`` digest in the in-toto export, so a tool that
    matches only sha256 can be handed these bytes as the artifact.
    """
    lines: list[bytes] = []
    _scan(repo, None, lines)
    return b"".join(lines)


def inspect_tree(repo: Path) -> Snapshot:
    """Hash ``repo`` in place (no copy): its tree hash, sha256 twin and clean commit."""
    return _scan(repo, None)


def _holds(path: Path, tree: str) -> bool:
    """True when snapshot directory ``path`` hashes, every file in it, to ``tree``.

    A directory that merely carries a tree's name proves nothing: anyone who can compute the
    hash of the buggy tree could plant a fixed one under that name.
    """
    return _scan(path, None, commit=False, everything=True).tree_hash == tree


def _seal(root: Path) -> None:
    """Make every directory under ``root`` read-only (files were sealed as they were copied)."""
    for dirpath, _dirs, _names in os.walk(root, topdown=False):
        os.chmod(dirpath, 0o555)


def remove_snapshot(path: Path) -> None:
    """Delete a snapshot directory (unsealing it first); missing is fine."""
    if not path.exists():
        return
    for dirpath, _dirs, _names in os.walk(path):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def snapshot(repo: Path, root: Path) -> Snapshot:
    """Copy exactly the hashed files of ``repo`` to ``root/<tree hash>``, sealed read-only.

    The copy is made in a private temp directory and renamed into place, so a snapshot
    directory that exists is complete; if one for the same hash exists already (a resumed
    run, a parallel caller) it is reused and the fresh copy dropped.

    Raises:
        UserError: a symlink in the tree points outside it.
    """
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = root / f".tmp-{os.getpid()}-{secrets.token_hex(6)}"
    tmp.mkdir(mode=0o700)
    try:
        snap = _scan(repo, tmp)
        _seal(tmp)
        final = root / snap.tree_hash
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            if _holds(final, snap.tree_hash):  # a parallel caller's copy of the same tree
                remove_snapshot(tmp)
            else:  # planted or altered under the name of this tree: ours replaces it
                remove_snapshot(final)
                os.rename(tmp, final)
    except BaseException:
        remove_snapshot(tmp)
        raise
    return Snapshot(tree_hash=snap.tree_hash, sha256=snap.sha256, commit_sha=snap.commit_sha,
                    path=final, files=snap.files, size=snap.size)


def snapshot_root() -> Path:
    """Where ``choir`` keeps snapshots: a ``snapshots`` folder beside the run folders."""

    return artifact_dir() / "snapshots"


def ensure_snapshot(repo: Path, tree: str, root: Path | None = None) -> Path:
    """The sealed snapshot of tree ``tree``: the existing one, or a fresh copy of ``repo``.

    A resumed run (its snapshot removed, or taken on another machine) re-copies the live
    tree and uses it only if it hashes to ``tree``: never verify a different tree than the
    one the evidence will name.

    Raises:
        IntegrityError: the live tree no longer hashes to ``tree``.
    """

    root = root or snapshot_root()
    existing = root / tree
    if existing.is_dir():
        if _holds(existing, tree):
            return existing
        remove_snapshot(existing)  # not the tree it is named for: never verify it
    snap = snapshot(repo, root)
    if snap.tree_hash != tree:
        assert snap.path is not None
        remove_snapshot(snap.path)
        raise IntegrityError(
            f"the tree at {repo} changed since it was hashed ({tree[:12]} recorded, "
            f"{snap.tree_hash[:12]} now); nothing verified on it")
    assert snap.path is not None
    return snap.path


def commit_tree_hash(repo: Path, rev: str) -> str | None:
    """The tree hash ``rev``'s committed tree would have, computed from git's objects.

    The same (kind, path, blake3) list ``tree_hash`` makes of a clean checkout, so ``gate
    --commit`` can check that an ASSERT's tree really is that commit's. Every object is
    re-hashed as it is read, and replace refs and grafts are off, so a commit cannot be made
    to read as another. None when ``rev`` is not a commit in ``repo``, or one of its objects
    is missing or planted.
    """
    git = locate(repo)
    sha = git.rev(rev) if git is not None else None
    if git is None or sha is None:
        return None
    outer = blake3.blake3()
    try:
        with git.objects() as objects:
            for path, kind, oid in sorted(objects.files(objects.commit_tree(sha))):
                inner = blake3.blake3(max_threads=1)
                objects.stream(oid, "blob", inner.update)
                outer.update(f"{kind} {path}\0".encode("utf-8", "surrogateescape"))
                outer.update(inner.digest())
    except (IntegrityError, OSError, ValueError):
        return None
    return outer.hexdigest()
