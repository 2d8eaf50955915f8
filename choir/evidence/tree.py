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

``commit_sha`` is recorded only when the snapshot equals HEAD's tree file by file (git blob
ids of the copied bytes against ``git ls-tree``), so a commit is never named for a tree that
had uncommitted changes.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3

from choir._core.paths import artifact_dir
from choir.exceptions import IntegrityError, UserError

_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv"}
_CHUNK = 1 << 20


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            # an executor can write the repo's .git/config, and git runs core.fsmonitor
            # from it, here, outside any sandbox: never let it (tests/integration/
            # test_executor_sandbox.py::test_an_executor_cannot_plant_git_config...)
            ["git", "-c", "core.fsmonitor=false", "-C", str(repo), *args],
            capture_output=True,
            check=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode("utf-8", "surrogateescape")


def resolve_commit(repo: Path, rev: str) -> str | None:
    """The full sha of commit ``rev`` in ``repo``, or None."""
    out = _git(repo, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}")
    return out.strip() or None if out else None


def commit_sha(repo: Path) -> str | None:
    """HEAD's sha, or None outside git or before the first commit."""
    out = _git(repo, "rev-parse", "--verify", "-q", "HEAD")
    return out.strip() or None if out else None


def _is_git(repo: Path) -> bool:
    return (repo / ".git").exists()


def _files(repo: Path, *, everything: bool = False) -> Iterator[str]:
    listed = None if everything else _git(repo, "ls-files", "-z", "--cached", "--others",
                                           "--exclude-standard")
    if listed is not None and _is_git(repo):
        yield from sorted({p for p in listed.split("\0") if p})
        return
    found: list[str] = []
    for root, dirs, names in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if everything or d not in _SKIP_DIRS)
        for name in names:
            found.append(os.path.relpath(os.path.join(root, name), repo))
    yield from sorted(found)


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


def _head_blobs(repo: Path) -> tuple[str, dict[str, tuple[str, str]]] | None:
    """HEAD's sha and {path: (kind, blob id)} of its tree, or None (no git, no commit)."""
    head = commit_sha(repo)
    if not head:
        return None
    listed = _git(repo, "ls-tree", "-r", "-z", "--full-tree", head)
    if listed is None:
        return None
    blobs: dict[str, tuple[str, str]] = {}
    for entry in listed.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        mode, _kind, oid = meta.split(" ")
        kind = {"100755": "x", "100644": "f", "120000": "l"}.get(mode, "?")
        blobs[path] = (kind, oid)
    return head, blobs


def _blob_hasher(oid_len: int, size: int) -> hashlib._Hash:
    hasher = hashlib.sha256() if oid_len == 64 else hashlib.sha1()  # noqa: S324 - git's id
    hasher.update(f"blob {size}\0".encode())
    return hasher


def _inside(root: Path, link: Path, target: str) -> bool:
    """True when a symlink at ``link`` pointing to ``target`` stays under ``root``."""
    if os.path.isabs(target):
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    return resolved == str(root) or resolved.startswith(str(root) + os.sep)


def _copy_file(src: Path, dst: Path | None, hashers: list[object], mode: int) -> int:
    """Stream ``src`` into every hasher (and ``dst``, created read-only); returns the size."""
    size = 0
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode) if dst is not None else -1
    try:
        if out >= 0:
            os.fchmod(out, mode)  # whatever the umask: a sandbox user must be able to read it
        with open(src, "rb") as fh:
            for chunk in iter(lambda: fh.read(_CHUNK), b""):
                size += len(chunk)
                for h in hashers:
                    h.update(chunk)  # type: ignore[attr-defined]
                if out >= 0:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
    finally:
        if out >= 0:
            os.close(out)
    return size


def _scan(repo: Path, dest: Path | None, manifest: list[bytes] | None = None,
          *, commit: bool = True, everything: bool = False) -> Snapshot:
    """One pass over the tree: hash every listed file and, with ``dest``, copy it there."""
    repo = repo.resolve()
    head = _head_blobs(repo) if commit and _is_git(repo) else None
    oid_len = len(head[0]) if head else 40
    seen: dict[str, tuple[str, str]] = {}
    outer, outer256 = blake3.blake3(), hashlib.sha256()
    files = total = 0
    made: set[Path] = set()
    for rel in _files(repo, everything=everything):
        path = repo / rel
        try:
            st = path.lstat()
        except FileNotFoundError:  # listed by git but deleted in the working tree
            continue
        inner, inner256 = blake3.blake3(max_threads=1), hashlib.sha256()
        target_path = dest / rel if dest is not None else None
        if target_path is not None and target_path.parent not in made:
            target_path.parent.mkdir(parents=True, exist_ok=True)
            made.add(target_path.parent)
        if stat.S_ISLNK(st.st_mode):
            link = os.readlink(path)
            data = link.encode("utf-8", "surrogateescape")
            if target_path is not None:
                if not _inside(repo, path, link):
                    raise UserError(
                        f"{path} is a symlink to {link}, outside the repo: a verifier could "
                        "follow it out of the tree it verifies; fix: make it relative and "
                        "inside the repo, or remove it")
                os.symlink(link, target_path)
            blob = _blob_hasher(oid_len, len(data))
            for h in (inner, inner256, blob):
                h.update(data)
            kind, size = "l", len(data)
        elif stat.S_ISREG(st.st_mode):
            blob = _blob_hasher(oid_len, st.st_size)
            kind = "x" if st.st_mode & 0o111 else "f"
            size = _copy_file(path, target_path, [inner, inner256, blob],
                              0o555 if kind == "x" else 0o444)
            if size != st.st_size:  # changed under us: the blob id header is wrong
                blob = _blob_hasher(oid_len, -1)
        else:
            continue
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
    clean = head is not None and seen == head[1]
    return Snapshot(tree_hash=outer.hexdigest(), sha256=outer256.hexdigest(),
                    commit_sha=head[0] if head and clean else None, path=dest,
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
    --commit`` can check that an ASSERT's tree really is that commit's. None when ``rev`` is
    not a commit in ``repo``.
    """
    sha = _git(repo, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}")
    listed = _git(repo, "ls-tree", "-r", "-z", "--full-tree", sha.strip()) if sha else None
    if listed is None:
        return None
    entries: list[tuple[str, str, str]] = []
    for entry in listed.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        mode, _kind, oid = meta.split(" ")
        kind = {"100755": "x", "100644": "f", "120000": "l"}.get(mode)
        if kind is not None:  # submodules are not files in the tree either
            entries.append((path, kind, oid))
    entries.sort()
    outer = blake3.blake3()
    with subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        for path, kind, oid in entries:
            proc.stdin.write(f"{oid}\n".encode())
            proc.stdin.flush()
            size = int(proc.stdout.readline().split()[2])
            data = proc.stdout.read(size)
            proc.stdout.read(1)
            outer.update(f"{kind} {path}\0".encode("utf-8", "surrogateescape"))
            outer.update(blake3.blake3(data).digest())
        proc.stdin.close()
    return outer.hexdigest()
