"""Identify exactly what was verified: a content hash of the working tree, and its commit.

The tree hash covers every file git would track (tracked and untracked-but-not-ignored) with
its mode and contents, so uncommitted changes change the hash. Outside git, every file under
the repo except ``.git`` and caches. Evidence is bound to this hash, so it cannot be reused
for a different tree.

Verifiers never read the live working tree: ``snapshot`` seals exactly the hashed files
into a read-only directory in the same pass that hashes them (the hash is over the bytes
sealed), and that directory is what the sandbox sees. Ignored files (a ``conftest.py``
hidden by ``.git/info/exclude``, a stale ``__pycache__``) are absent from it, and a process
left behind by the executor cannot change it afterwards. Never a hard link to the live file
(a leftover process would write through it): the sealed files are Choir's own copies in a
content-addressed store, shared by the rounds whose trees hold the same bytes, and a round
builds its tree from the tree the last one parked (``choir.evidence.store``); files
whose ``lstat`` did not change are not read again (``choir.evidence.statcache``), unless
the mood reads them all (PARANOID's ``rehash: full``).

Every file is opened through ``choir._core.fsopen``, one component at a time and never
through a link: git lists paths from its index, and a staged ``lnk/key`` whose folder was
swapped for a symlink to the signing key's folder must not be copied into the snapshot.

``commit_sha`` is recorded only when the tree HEAD's commit object records (its bytes
re-hashed, replace refs and grafts off: ``choir.evidence.git``) equals the git tree id
computed here from the hashed bytes, so a commit is never named for a tree that had
uncommitted changes, nor for a tree that git was made to show in its place.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import blake3

from choir._core import fsopen
from choir._core.paths import artifact_dir
from choir.evidence.git import GitRepo, ObjectReader, is_oid, locate
from choir.evidence.scan import LIST, CopySink, Snapshot, Stray, scan
from choir.evidence.sealer import Sealer, StaleBase
from choir.evidence.statcache import repo_key
from choir.evidence.store import Store, rmtree
from choir.exceptions import IntegrityError, UserError

if TYPE_CHECKING:
    from choir.evidence.git import ObjectReader

# (common folder, commit id) -> (tree hash, parents): a commit's id names its bytes, and
# every object is re-hashed as it is read, so what was read once for an id holds for good
# (the plan driver asks for each item's commit three times: its submodules, its head, its
# landing)
_RECORDS: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}
_RECORDS_MAX = 4096


def resolve_commit(repo: Path, rev: str) -> str | None:
    """The full sha of commit ``rev`` in ``repo``, or None."""
    git = locate(repo)
    return git.rev(rev) if git is not None else None


def commit_sha(repo: Path) -> str | None:
    """HEAD's sha, or None outside git or before the first commit."""
    return resolve_commit(repo, "HEAD")


def tree_hash(repo: Path) -> str:
    """Hex blake3 over (path, mode, content hash) of every file in the working tree."""
    return scan(repo, None, commit=False).tree_hash


def tree_manifest(repo: Path) -> bytes:
    """The tree's canonical manifest: ``KIND SHA256 PATH\\0`` per file, in path order.

    KIND is ``f`` (file), ``x`` (executable) or ``l`` (symlink; its target is hashed). Its
    sha256 is the tree subject's ``sha256`` digest in the in-toto export, so a tool that
    matches only sha256 can be handed these bytes as the artifact.
    """
    lines: list[bytes] = []
    scan(repo, None, lines)
    return b"".join(lines)


def inspect_tree(repo: Path) -> Snapshot:
    """Hash ``repo`` in place (no copy): its tree hash, sha256 twin and clean commit."""
    return scan(repo, None)


def _holds(path: Path, tree: str, *, full: bool = False) -> bool:
    """True when snapshot directory ``path`` hashes, every file in it, to ``tree``.

    A directory that merely carries a tree's name proves nothing: anyone who can compute the
    hash of the buggy tree could plant a fixed one under that name. A tree the store lent at
    ``path`` is first checked by the ``lstat`` of every entry against its record (nothing
    read; ``Store.holds``), unless ``full``; everything else is hashed whole.
    """
    if not full:
        store = Store.for_place(path, create=False)
        if store is not None and store.holds(path, tree):
            return True
    try:
        return scan(path, None, commit=False, everything=True).tree_hash == tree
    except (Stray, UserError):  # a FIFO, socket or device, or folders nested past the bound
        return False


def _seal(root: Path) -> None:
    """Make every directory under ``root`` read-only (files were sealed as they were copied)."""
    for dirpath, _dirs, _names in os.walk(root, topdown=False):
        os.chmod(dirpath, 0o555)


def remove_snapshot(path: Path) -> None:
    """Delete a snapshot directory (unsealing it first); a tree the store lent at ``path``
    or inside it goes back to the store's pool instead, for the next round to build on.
    Missing is fine."""
    if not os.path.lexists(path):
        return
    store = Store.for_place(path, create=False)
    if store is not None:
        store.reclaim(path)
    rmtree(path)


def snapshot(repo: Path, root: Path, *, full: bool = False) -> Snapshot:
    """Exactly the hashed files of ``repo`` at ``root/<tree hash>``, sealed read-only.

    Built from the store's sealed trees (``choir.evidence.store``): only files whose
    bytes the store does not hold are read into new objects; unchanged files are found by
    the stat cache (``choir.evidence.statcache``) without reading them, unless ``full``
    (PARANOID), which reads every file and hashes the finished tree again, whole. Where the
    store cannot be used (``root`` on another file system), the files are copied. Either
    way the tree is made privately and renamed into place, so a snapshot directory that
    exists is complete; if one for the same hash exists already (a resumed run, a parallel
    caller) it is reused and the fresh one dropped.

    Raises:
        UserError: a symlink in the tree points outside it.
    """
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store.for_place(root)
    if store is not None:
        sealed = _sealed(repo, root, store, full)
        if sealed is not None:
            return sealed
    return _copied(repo, root, full)


def _placed(snap: Snapshot, path: Path) -> Snapshot:
    return Snapshot(tree_hash=snap.tree_hash, sha256=snap.sha256, commit_sha=snap.commit_sha,
                    path=path, files=snap.files, size=snap.size)


def _sealed(repo: Path, root: Path, store: Store, full: bool) -> Snapshot | None:
    """``snapshot`` through the store; None when the tree it built failed its check (it is
    dropped, and the caller copies instead). A base found written between rounds, the
    store's copy of the bytes too, after the scan took it as kept (its check ran beside the
    scan) is dropped, and the snapshot made again with the check first."""
    try:
        return _seal_once(repo, root, store, full, beside=True)
    except StaleBase:
        return _seal_once(repo, root, store, full, beside=False)


def _seal_once(repo: Path, root: Path, store: Store, full: bool, *,
               beside: bool) -> Snapshot | None:
    real = repo.resolve()
    git = locate(real)
    # git's two processes start now and run while the store readies the base
    listing, unasked = git.start(*LIST) if git is not None else (None, None)
    objects = _reader(git) if git is not None else None
    family = repo_key(git.common_dir) if git is not None else ""
    try:
        sealer = Sealer(store, repo_key(real), family, full=full)
    except BaseException:
        if objects is not None:
            objects.close()
        if unasked is not None:
            unasked()
        raise
    try:
        if beside:  # while git lists the tree, and for a big base, all through the scan
            sealer.start_check()
        else:
            sealer.check()
        snap = scan(real, sealer, store=None if full else store, listing=listing,
                    objects=objects)
        sealer.reconcile()
        try:
            tree = sealer.build()
        except OSError:  # a base someone altered past repair: never used
            sealer.discard(None)
            return None
        if full and not _holds(tree, snap.tree_hash, full=True):
            sealer.discard(tree)
            return None
        final = root / snap.tree_hash
        if _into_place(tree, final, snap.tree_hash, full=full):
            sealer.lend(tree, final, snap.tree_hash)
        else:
            sealer.park(tree, snap.tree_hash)
        return _placed(snap, final)
    finally:
        sealer.close()
        if objects is not None:
            objects.close()
        if unasked is not None:
            unasked()  # reaped already when the scan asked for it: then nothing to do


def _reader(git: GitRepo) -> ObjectReader | None:
    """A reader of ``git``'s objects, started now; None when git cannot start (the scan
    then asks git for ``HEAD`` its own way)."""
    try:
        return git.objects().start()
    except OSError:
        return None


def _into_place(made: Path, final: Path, tree: str, *, full: bool = False) -> bool:
    """Rename ``made`` to ``final``: True once it is there; False when a snapshot of the
    same tree is there already (a resumed run, a parallel caller) and is kept (``made`` is
    the caller's to drop). One planted or altered under the tree's name is replaced."""
    try:
        os.rename(made, final)
        return True
    except OSError:
        if not final.is_dir():
            raise
    if _holds(final, tree, full=full):
        return False
    remove_snapshot(final)
    os.rename(made, final)
    return True


def _copied(repo: Path, root: Path, full: bool = False) -> Snapshot:
    """``snapshot`` by copying every file (the store unusable, or its tree refused); a tree
    of the same hash found in place is kept only after the check ``full`` asks for."""
    tmp = root / f".tmp-{os.getpid()}-{secrets.token_hex(6)}"
    tmp.mkdir(mode=0o700)
    try:
        with fsopen.DirCursor(tmp, create=True) as dest:
            snap = scan(repo, CopySink(dest))
        _seal(tmp)
        final = root / snap.tree_hash
        if not _into_place(tmp, final, snap.tree_hash, full=full):
            remove_snapshot(tmp)
    except BaseException:
        remove_snapshot(tmp)
        raise
    return _placed(snap, final)


def snapshot_root() -> Path:
    """Where ``choir`` keeps snapshots: a ``snapshots`` folder beside the run folders."""

    return artifact_dir() / "snapshots"


def ensure_snapshot(repo: Path, tree: str, root: Path | None = None, *,
                    full: bool = False) -> Path:
    """The sealed snapshot of tree ``tree``: the existing one, or a fresh one of ``repo``.

    A resumed run (its snapshot removed, or taken on another machine) takes the live tree
    again and uses it only if it hashes to ``tree``: never verify a different tree than the
    one the evidence will name. ``full`` (PARANOID): the existing one is hashed whole.

    Raises:
        IntegrityError: the live tree no longer hashes to ``tree``.
    """

    root = root or snapshot_root()
    existing = root / tree
    if existing.is_dir():
        if _holds(existing, tree, full=full):
            return existing
        remove_snapshot(existing)  # not the tree it is named for: never verify it
    snap = snapshot(repo, root, full=full)
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
    if git is None:
        return None
    if is_oid(rev):  # a commit's full id (the driver's and the gate's): no rev-parse
        found = _commit_record(git, rev)
        if found is not None:
            return found[0]
    sha = git.rev(rev)  # a name, or a full id that is not a commit's (an annotated tag's)
    found = _commit_record(git, sha) if sha is not None and sha != rev else None
    return found[0] if found is not None else None


def commit_submodules(repo: Path, *shas: str) -> list[dict[str, str]] | None:
    """``{path: commit id}`` of the submodule entries of each commit whose full id is in
    ``shas`` (``commit_outside``'s first half); None when one cannot be read."""
    read = commit_outside(repo, *shas)
    return None if read is None else [submodules for submodules, _ in read]


# attributes that make git's checkout of a file differ from its blob (gitattributes(5)): a
# round reads the blob's bytes, a person checking the commit out would get others
# and what ``git archive`` of the commit changes (``export-subst`` expands ``$Format:...$``
# in the file, ``export-ignore`` leaves it out): release tarballs are made so
CONVERSIONS = frozenset({"text", "eol", "crlf", "ident", "filter", "working-tree-encoding",
                         "binary", "export-subst", "export-ignore"})
ATTRIBUTES = ".gitattributes"


def _attribute_lines(data: bytes) -> Iterator[tuple[str, list[str]]]:
    """Each line of a ``.gitattributes`` file and its words, as git reads them (attr.c), in
    order: lines end at ``\\n`` only (a review's ``b.txt\\rtext\\reol=crlf`` was three lines
    to ``splitlines`` and one line of three words to git), a UTF-8 byte order mark is
    skipped, words are split on git's blanks alone (space, tab, ``\\r``: ``str.split`` also
    took a form feed, so ``\\f#lib.sh text`` was a comment to Choir and a pattern to git),
    and a comment is a line whose first word starts with ``#``."""
    for raw in data.removeprefix(b"\xef\xbb\xbf").split(b"\n"):
        words = [w for w in re.split(rb"[ \t\r]+", raw) if w]
        if words and not words[0].startswith(b"#"):
            # the line with its blanks kept: a quoted pattern's ("a  b.txt") are part of
            # it, so the line is what a change is judged by
            yield (raw.strip(b" \t\r").decode("utf-8", "surrogateescape"),
                   [w.decode("utf-8", "surrogateescape") for w in words])


def attribute_macros(data: bytes) -> frozenset[str]:
    """The names ``[attr]NAME`` lines of a ``.gitattributes`` file define."""
    return frozenset(words[0][len("[attr]"):] for _line, words in _attribute_lines(data)
                     if words[0].startswith("[attr]"))


def conversion_lines(data: bytes, macros: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The lines of a ``.gitattributes`` file that set, unset or define (``[attr]`` macros)
    anything a checkout or an archive converts a file by, ``macros`` (names defined in the
    commit's files) included, in the file's order: a later line that matches overrides an
    earlier one, so the same lines in another order convert other files (a review swapped
    ``* text=auto eol=crlf`` and ``*.sh text eol=lf``). A quoted pattern holding a blank only
    adds words to look at: nothing is missed."""
    names = CONVERSIONS | macros
    return tuple(line for line, words in _attribute_lines(data)
                 if words[0].startswith("[attr]") or any(
                     word.lstrip("-!").split("=", 1)[0] in names for word in words[1:]))


Outside = tuple[dict[str, str], dict[str, tuple[str, ...]]]
"""What a commit's tree hash does not cover: its submodule entries (``{path: commit id}``:
another repository's content, left out as a checkout's scan leaves it) and the conversion
lines of each of its ``.gitattributes`` files (``{path: conversion_lines}``: how a checkout
would change the bytes the tree hash is of)."""


def commit_outside(repo: Path, *shas: str) -> list[Outside] | None:
    """``Outside`` for each commit whose full id is in ``shas``, each tree walked once with
    one reader, from checked objects as ``commit_record`` reads them; None when one cannot
    be read so."""
    git = locate(repo)
    if git is None:
        return None
    try:
        with git.kept_objects() as objects:
            if shas:  # the first is a new commit, whose record is asked for next: read now
                _read_record(git, objects, shas[0])
            found: list[Outside] = []
            for sha in shas:
                submodules: dict[str, str] = {}
                read: dict[str, bytes] = {}
                for path, kind, oid in objects.entries(objects.commit(sha)[0]):
                    if kind == "m":
                        submodules[path] = oid
                    elif path.rpartition("/")[2].casefold() == ATTRIBUTES:
                        # any case (a checkout on a file system that folds it reads
                        # `.GitAttributes` as the file), and a link too: git reads a link's
                        # blob from the index as the file's text when it checks out
                        # (a review's `ln -s 'b.txt eol=crlf' .gitattributes`)
                        data = objects.read(oid, "blob")
                        read[path] = data if kind in "fx" else b"[attr]link " + data
                macros = frozenset().union(*map(attribute_macros, read.values()))
                found.append((submodules, {path: conversion_lines(data, macros)
                                           for path, data in read.items()}))
            return found
    except (IntegrityError, OSError, ValueError):
        return None


def commit_record(repo: Path, sha: str) -> tuple[str, tuple[str, ...]] | None:
    """(the tree hash, the parents) of the commit whose full id is ``sha``, read as
    ``commit_tree_hash`` reads it (one reader for both); None as it gives None."""
    git = locate(repo)
    return _commit_record(git, sha) if git is not None else None


def _commit_record(git: GitRepo, sha: str) -> tuple[str, tuple[str, ...]] | None:
    known = _RECORDS.get((str(git.common_dir), sha))
    if known is not None:
        return known
    try:
        with git.kept_objects() as objects:
            return _read_record(git, objects, sha)
    except (IntegrityError, OSError, ValueError):
        return None


def _read_record(git: GitRepo, objects: ObjectReader,
                 sha: str) -> tuple[str, tuple[str, ...]]:
    """The record of commit ``sha`` read with ``objects``, and kept.

    Raises:
        IntegrityError, OSError, ValueError: an object is missing, planted or unreadable.
    """
    key = (str(git.common_dir), sha)
    known = _RECORDS.get(key)
    if known is not None:
        return known
    outer = blake3.blake3()
    tree, parents = objects.commit(sha)
    for path, kind, oid in sorted(objects.files(tree)):
        inner = blake3.blake3(max_threads=1)
        objects.stream(oid, "blob", inner.update)
        outer.update(f"{kind} {path}\0".encode("utf-8", "surrogateescape"))
        outer.update(inner.digest())
    if not is_oid(sha):  # only a full id names the bytes for good
        return outer.hexdigest(), tuple(parents)
    if len(_RECORDS) >= _RECORDS_MAX:
        _RECORDS.clear()
    _RECORDS[key] = found = (outer.hexdigest(), tuple(parents))
    return found
