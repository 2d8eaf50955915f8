"""Worktrees from the store: a plan item's worktree without writing its files.

``git worktree add`` writes every file of the checkout: a 2,000-file repo took 370-700 ms
here (creating a file with its bytes costs 44-300 us on this disk), and a plan makes a
worktree per item and per attempt. A worktree Choir makes is instead an overlay mount:

* its lower layer is a *checkout tree* of the start commit's git tree, kept in the store
  (``lowers/<tree id>``) and shared by every worktree of that tree: folders 0755, files
  hard links to objects named by git blob id (``objects/F``, ``objects/X``: 0644 and 0755,
  the modes git checks out), symlinks as git records them. The first is built from git's
  objects (every blob re-hashed as it is read: ``choir.evidence.git``); the next, for a
  later commit of the repo, links the last one's files and writes only the blobs that
  changed;
* its upper layer, in the worktree's own git admin folder, takes every write: overlayfs
  copies a file up before its first write, so nothing written in a worktree, by an
  executor or by git, reaches the store or another worktree;
* git gets the start commit's index by ``read-tree`` (no file written; git re-reads a file
  the first time it compares it).

A worktree is then two git calls and a mount: tens of milliseconds, whatever the size.

The mount belongs to Choir's process: git and every sandbox Choir starts see the worktree,
a shell outside sees its folder empty (the ``.git`` file only) while the plan runs, and a
resumed plan mounts it again (``remount``). So it is made only in a private mount namespace,
where the mount dies with the process (``choir plan run`` runs confined: as root, or in its
own user namespace); anywhere else, and for paths an overlay cannot take, ``git worktree
add`` as before. A lower is checked against its record (``lstat`` of every entry, as a
sealed tree is: ``choir.evidence.store``) each time a worktree is made from it; one that
differs is built again, unless a worktree stands on it. Each mounted worktree holds a shared
``flock`` on its lower (``_pin``) and a lower is removed only under the exclusive one, so no
process removes a lower another process's worktrees stand on (two plans at once: their
mounts are in different namespaces). What the lower holds is only where the item starts:
every round verifies the worktree as the executor left it, whatever was below it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from choir._core import fsopen, mounts
from choir.evidence import _table
from choir.evidence.store import CHUNK, RECORD, Store, rmtree, stamp_of, store_root
from choir.exceptions import IntegrityError

if TYPE_CHECKING:
    from choir.evidence.git import GitRepo, ObjectReader

LOWER_MAX = 8
# a lower's record: ``v2`` lowers hold a submodule's folder, empty, as git's checkout does; a
# lower made before has no record of this name, so it is made again when next asked for
_RECORD = ".v2.record"
_MODES = {"f": 0o644, "x": 0o755}
_KINDS = {"f": "F", "x": "X"}
_DIR = b"d"
_MNT_DETACH = 2
_RECORD_NAME = "choir-overlay"
_OCTAL = re.compile(rb"\\([0-7]{3})")
_PINS: dict[str, int] = {}  # a mounted worktree's real path -> its lower's pin (``_pin``)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _unescaped(field: bytes) -> bytes:
    """A path as ``/proc/self/mountinfo`` writes it, read back: the kernel writes a space,
    tab, newline and backslash as three octal digits after a backslash (``\\040``)."""
    return _OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), field)


def _mounted(path: Path) -> bool:
    """True when an overlay is mounted at exactly ``path`` in this namespace."""
    target = os.fsencode(os.path.realpath(path))
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            for line in fh:
                fields = line.split(b" ")
                sep = fields.index(b"-")
                if fields[sep + 1] == b"overlay" and _unescaped(fields[4]) == target:
                    return True
    except (OSError, ValueError):
        return False
    return False


def _mount(path: Path, lower: Path, upper: Path, work: Path) -> None:
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    if os.geteuid() != 0:  # mounted in Choir's user namespace: no trusted.* xattrs
        options += ",userxattr"
    libc = _libc()
    mounts.changed()
    if libc.mount(b"overlay", os.fsencode(path), b"overlay", 0, options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount overlay at {path}: {os.strerror(err)}")


def release(path: Path) -> None:
    """Unmount the overlay of a worktree Choir made at ``path`` (before git removes it), and
    let go of its lower."""
    if _mounted(path):
        mounts.changed()
        _libc().umount2(os.fsencode(os.path.realpath(path)), _MNT_DETACH)
    pin = _PINS.pop(os.path.realpath(path), -1)
    if pin >= 0:
        os.close(pin)


def _pin(lower: Path) -> int:
    """A descriptor of the lower at ``lower`` holding a shared ``flock`` on it, or -1 when
    there is none there (being removed, or removed since it was looked up).

    A worktree's mount holds its lower's pin for as long as it is mounted in this process
    (``_PINS``); removing a lower takes the exclusive lock without waiting and gives up
    when any pin holds it. Mounts are each process's own (every ``choir`` command has a
    mount namespace of its own), so the mount table says nothing of another process's
    worktrees: the lock does, whatever process holds it, and dies with it."""
    try:
        fd = fsopen.open_dir(lower)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a removal under way ends first
        if os.fstat(fd).st_ino == os.lstat(lower).st_ino:
            return fd
    except OSError:
        pass
    os.close(fd)  # moved away to be removed while this waited
    return -1


def drop_worktree(git: GitRepo, path: Path) -> None:
    """A worktree of ``git`` at ``path`` removed without a git process: its overlay
    unmounted first, so what is removed is the folder under the mount (its ``.git`` file),
    not every file of the checkout through the overlay (each a whiteout written in its upper
    layer); then git's record of it, as ``git worktree prune`` removes one whose folder is
    gone (so the branch it had is free to move again). ``shutil.rmtree`` follows no link,
    whatever a member planted; a link at ``path`` itself is left to git."""
    made = git.worktree_at(path, mount=False)  # its record, found while its folder is there
    release(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    if made is not None and not path.exists():
        rmtree(made.git_dir)


def planted_repositories(made: GitRepo, limit: int = 5) -> list[str]:
    """The first ``limit`` entries named ``.git`` (any case; a folder, or a file pointing
    at one) below the root of the worktree ``made``: each makes its folder a repository of
    its own, and git run in the worktree starts git in it, under that repository's config
    (``git add -A`` asks a submodule's folder whether it is dirty, and its ``git status``
    runs the filters that config names): a program of the member's, run by Choir's process
    on the host. The root's own ``.git`` is not listed (Choir's git never reads it).

    Read from an overlay worktree's upper layer, which holds everything written in it (its
    lower, the store's checkout, holds no ``.git``: ``_Checkout.fill``), so the cost is the
    change's, not the repository's; a plain worktree is walked whole. No link is followed;
    a tree too deep to walk is listed as such."""
    layers = _Layers(made.git_dir)
    root = layers.upper if layers.lower_id() is not None else made.root
    found: list[str] = [] if _points_home(made) else [
        ".git (the worktree's own, replaced: git there would read another repository's "
        "index and excludes)"]
    try:
        for entry in fsopen.walk(root, max_depth=fsopen.MAX_DEPTH):
            if entry.name.lower() == ".git" and "/" in entry.rel:
                found.append(entry.rel)
                if len(found) >= limit:
                    break
    except fsopen.TooDeep as exc:
        found.append(f"{exc.filename} (nested deeper than {fsopen.MAX_DEPTH} folders)")
    except OSError as exc:  # its upper layer or root gone: nothing to commit there
        found.append(f"(the worktree cannot be read: {exc})")
    return found


def _points_home(made: GitRepo) -> bool:
    """Whether the worktree's ``.git`` is still the file pointing at its admin folder. A
    member that made it a repository of its own (review 16d) had the item's round list the
    files that repository's index and excludes name, hiding one the commit, made through
    the admin folder, holds: the round ASSERTed a tree the commit is not."""
    try:
        text = fsopen.read_bytes(made.root, ".git", 4096)  # never through a link
    except OSError:
        return False
    line = text.decode("utf-8", "replace").strip()
    return line.startswith("gitdir:") and os.path.realpath(
        made.root / line[len("gitdir:"):].strip()) == os.path.realpath(made.git_dir)


@dataclass(frozen=True)
class _Layers:
    """Where one overlay worktree's layers are: its git admin folder holds the upper
    layer and the work folder overlayfs needs beside it."""

    admin: Path

    @property
    def folder(self) -> Path:
        return self.admin / _RECORD_NAME

    @property
    def upper(self) -> Path:
        return self.folder / "upper"

    @property
    def work(self) -> Path:
        return self.folder / "work"

    def lower_id(self) -> str | None:
        try:
            return fsopen.read_bytes(self.folder, "lower", 256).decode().strip() or None
        except OSError:
            return None


def _usable(*paths: Path) -> bool:
    """Overlay options are comma- and colon-separated: paths holding either are not
    passed."""
    return not any(ch in str(p) for p in paths for ch in ",:\\\n")


def overlay_worktree(git: GitRepo, path: Path, branch: str | None,
                     start: str) -> GitRepo | None:
    """The worktree ``git worktree add -B branch path start`` would make, as an overlay of
    the store's checkout of ``start``; None when it cannot be one here (the caller makes a
    plain one)."""
    store = Store.for_place(store_root(), create=True) if mounts.private() else None
    if store is None or not _usable(path, store.root):
        return None
    made = _linked_worktree(git, path, branch, start)
    if made is None:  # git's own, which also takes over a path a missing worktree still has
        on = ("-B", branch) if branch is not None else ("--detach",)
        git.write("worktree", "add", "--no-checkout", "-f", *on, str(path), start,
                  filters=False)
        made = git.worktree_at(path)
    if made is None:
        return None
    # ``-B branch start`` put HEAD at ``start``: a commit's full id (the plan driver's) is
    # read as one directly, with no rev-parse; a name, or the id of a tag, is asked of HEAD
    from choir.evidence.git import is_oid

    layers = _Layers(made.git_dir)
    usable = _usable(layers.folder)  # its admin path can be named in the mount's options
    found = _lower_of(made, store, start) if usable and is_oid(start) else None
    if found is None and usable:
        commit = made.rev("HEAD")
        try:
            found = _lower_of(made, store, commit, strict=True) if commit else None
        except IntegrityError:  # not a commit, or its lower altered while in use: git's own
            found = None
    if found is None:
        _undone(git, path)
        return None
    commit, tree, lower, pin = found
    try:
        rmtree(layers.folder)
        for folder in (layers.upper, layers.work):
            folder.mkdir(parents=True, mode=0o755)
        dotgit = fsopen.read_bytes(path, ".git", 4096)  # the worktree's .git file, kept above
        (layers.upper / ".git").write_bytes(dotgit)
        (layers.folder / "lower").write_text(tree + "\n")
        try:
            _mount(path, lower, layers.upper, layers.work)
        except OSError:  # overlays refused here (a file system, a kernel): a checkout instead
            rmtree(layers.folder)
            _undone(git, path)
            return None
        _PINS[os.path.realpath(path)], pin = pin, -1  # held while it is mounted
    finally:
        if pin >= 0:
            os.close(pin)
    made.write("read-tree", commit, filters=False)
    return made


def _undone(git: GitRepo, path: Path) -> None:
    """The worktree record just made at ``path`` removed, so the caller's ``git worktree
    add`` makes a plain checkout there instead."""
    git.write("worktree", "remove", "--force", str(path), check=False)
    git.write("worktree", "prune", check=False)


def _linked_worktree(git: GitRepo, path: Path, branch: str | None,
                     start: str) -> GitRepo | None:
    """What ``git worktree add --no-checkout -f -B branch path start`` makes, with one git
    process where git's own spawns two more (``git branch`` and ``git symbolic-ref``, 6-15 ms
    together here, twice an item in a plan), and with none for a detached one (no
    ``branch``: ``--detach``, ``start`` a full commit id); None when it cannot be made so.

    The branch is moved by ``git branch -f``, as ``worktree add -B`` does, so git's own
    refusal to move a branch checked out elsewhere (a person's checkout) stands. The records
    are those gitrepository-layout(5) documents and ``worktree add`` writes: a folder
    ``worktrees/<name>`` in the common git folder holding ``gitdir`` (the worktree's ``.git``
    by its real path), ``commondir`` and ``HEAD`` (the branch, symbolically, or the commit's
    id), and the
    worktree's ``.git`` file naming that folder. ``gitdir`` is written last, after the file
    it names: a record without it is one ``git worktree prune`` removes, so a process killed
    while writing leaves nothing a prune keeps (git's own ``locked`` file, which it writes
    meanwhile, would be left behind and keep the record, and its branch, forever); a prune
    run meanwhile by another process (removing the folder before ``gitdir``) makes a write
    fail, and git's own ``worktree add`` is used instead."""
    from choir.evidence.git import is_oid

    if path.exists() or path.is_symlink():
        return None  # the caller removed what was there: one there now is not ours to reuse
    if branch is None:  # detached: HEAD is the commit itself, named by its full id
        if not is_oid(start):
            return None
    elif git.write("branch", "-f", branch, start, check=False, filters=False).returncode:
        return None  # checked out elsewhere (perhaps by a worktree whose folder is gone)
    path.mkdir(parents=True, mode=0o755)
    root = Path(os.path.realpath(path))
    admins = git.common_dir / "worktrees"
    admins.mkdir(mode=0o755, exist_ok=True)
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in root.name) or "worktree"
    admin = admins / name
    while True:
        try:
            admin.mkdir(mode=0o755)
            break
        except FileExistsError:
            admin = admins / f"{name}-{secrets.token_hex(4)}"
    try:
        (admin / "commondir").write_text("../..\n")
        (admin / "HEAD").write_text(f"ref: refs/heads/{branch}\n" if branch is not None
                                    else f"{start}\n")
        (root / ".git").write_text(f"gitdir: {os.path.realpath(admin)}\n")
        (admin / "gitdir").write_text(f"{root / '.git'}\n")  # last: the record is whole
    except OSError:
        rmtree(admin)
        rmtree(root)
        return None
    return git.worktree_at(root)


def _lower_of(made: GitRepo, store: Store, commit: str, *,
              strict: bool = False) -> tuple[str, str, Path, int] | None:
    """(``commit``, its git tree, the store's checkout of that tree, its pin: the caller's
    to keep or close); None when ``commit`` is no commit (``strict``: raised)."""
    try:  # the reader starts git only when asked what it has not read before
        with made.kept_objects() as objects:
            tree = objects.commit_tree(commit)
            return (commit, tree, *_Lowers(store).get(made, objects, tree))
    except IntegrityError:
        if strict:
            raise
        return None


def remount(made: GitRepo) -> None:
    """Mount again the overlay of a worktree Choir made (a resumed plan, a new process):
    a no-op for a plain worktree or one mounted already."""
    layers = _Layers(made.git_dir)
    tree = layers.lower_id()
    if tree is None or _mounted(made.root) or not mounts.private():
        return
    store = Store.for_place(store_root(), create=True)
    if store is None:
        return
    with made.kept_objects() as objects:
        lower, pin = _Lowers(store).get(made, objects, tree)
    try:
        _mount(made.root, lower, layers.upper, layers.work)
    except BaseException:
        os.close(pin)
        raise
    _PINS[os.path.realpath(made.root)] = pin


class _Lowers:
    """The store's checkout trees: ``lowers/<git tree id>``, each with its record."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.root = store.root / "lowers"
        self.root.mkdir(mode=0o700, exist_ok=True)

    def _record(self, tree: str) -> _table.Table:
        return _table.Table(self.root / f"{tree}{_RECORD}", RECORD)

    def get(self, git: GitRepo, objects: ObjectReader, tree: str) -> tuple[Path, int]:
        """The checkout tree of git tree ``tree`` with its pin (``_pin``): the one kept, when
        it still matches its record, else one built now.

        Raises:
            IntegrityError: the one kept differs from its record while a worktree (of this
                process or another) stands on it: it is neither used nor removed.
        """
        path = self.root / tree
        built = False
        for _ in range(3):  # removed by another process between the build and the pin
            pin = _pin(path)
            if pin >= 0:
                if self._holds(path, tree):
                    os.utime(self.root / f"{tree}{_RECORD}")
                    if built:
                        self._trim()  # pinned first: never the one just made
                    return path, pin
                os.close(pin)  # written by someone (the ctime of a link alone holds)
            if os.path.lexists(path) and not self._evict(tree):
                raise IntegrityError(f"the store's checkout {path} differs from its record "
                                     "while worktrees use it: not used, not removed")
            self._build(git, objects, tree)
            built = True
        raise IntegrityError(f"the store's checkout {path} was removed as it was made")

    def _holds(self, path: Path, tree: str) -> bool:
        """True when every entry of the lower at ``path`` is what its record says.

        A file's ctime alone may differ: its inode is shared, by hard links, with the
        store's object and every other lower holding the same blob, and each new link to
        it (a lower built later, a sealed tree) sets its ctime. Such a file is read again
        and kept, its record brought up to date, only when its bytes still hash to its blob
        id, as a sealed tree's entry is (``choir.evidence.store``); anything else that
        differs fails the lower. (Failing it for a ctime alone rebuilt it, and removed it
        under the overlays of the worktrees still using it: their files vanished.)"""
        table = self._record(tree)
        rows = table.rows
        if not rows:
            return False
        rels = sorted(rows.keys())
        stale: dict[str, tuple[object, ...]] = {}
        with fsopen.DirCursor(path) as cursor:
            for rel, st in zip(rels, fsopen.lstat_many(path, rels), strict=True):
                if isinstance(st, OSError):
                    return False
                row = rows[rel]
                stamp = stamp_of(st)
                if stamp == row[:5]:
                    continue
                kind = row[5].decode()
                parts = rel.split("/")
                if stamp[:3] != row[:3] or stamp[4] != row[4] or kind not in _KINDS or \
                        not _blob_matches(cursor.dir(parts[:-1]), parts[-1],
                                          _blob_id(row[6]), kind):
                    return False
                stale[rel] = (*stamp, *row[5:])
        table.save(stale)
        return True

    def _evict(self, tree: str) -> bool:
        """Remove the lower of ``tree`` unless a worktree stands on it (any pin): True once
        it is gone."""
        path = self.root / tree
        try:
            fd = fsopen.open_dir(path)
        except OSError:
            fd = -1  # not a folder (a planted file or link): nothing stands on it
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
            doomed = self.store.root / "work" / f"evict-lower-{tree}-{secrets.token_hex(4)}"
            with contextlib.suppress(OSError):
                os.rename(path, doomed)
            for suffix in (_RECORD, ".record"):  # and the record of a lower before v2
                (self.root / f"{tree}{suffix}").unlink(missing_ok=True)
            rmtree(doomed)
        finally:
            if fd >= 0:
                os.close(fd)
        self.store.sweep_objects()
        return True

    def _base(self) -> tuple[Path, dict[str, tuple[bytes, bytes]]] | None:
        """The most recently used lower, with what its files are: links from it cost less
        than writing its blobs again (a plan's next commit shares most of them)."""
        records = sorted(self.root.glob(f"*{_RECORD}"), key=lambda p: p.stat().st_mtime,
                         reverse=True)
        for record in records:
            tree = record.name.removesuffix(_RECORD)
            path = self.root / tree
            if path.is_dir() and self._holds(path, tree):
                rows = self._record(tree).rows
                return path, {rel: (row[5], row[6]) for rel, row in rows.items()
                              if row[5] != _DIR}
        return None

    def _build(self, git: GitRepo, objects: ObjectReader, tree: str) -> Path:
        work = self.store.root / "work" / f"{os.getpid()}-lower-{secrets.token_hex(4)}"
        work.mkdir(mode=0o700)
        try:
            made = work / "tree"
            made.mkdir(mode=0o755)
            rows = _Checkout(self.store, objects, made, self._base()).fill(tree)
            final = self.root / tree
            try:
                os.rename(made, final)
            except OSError as exc:  # built by another caller meanwhile: theirs is kept
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                return final
            self._record(tree).replace(rows)
            return final
        finally:
            rmtree(work)

    def _trim(self) -> None:
        """Keep the ``LOWER_MAX`` lowers used last; a lower a worktree still stands on stays
        (``_evict``: its pin), whatever process mounted it."""
        records = sorted(self.root.glob(f"*{_RECORD}"), key=lambda p: p.stat().st_mtime)
        for record in records[:max(0, len(records) - LOWER_MAX)]:
            self._evict(record.name.removesuffix(_RECORD))  # one a worktree uses stays


def _blob_id(packed: bytes) -> str:
    """A record's blob id (20 bytes of sha1 padded to 32, or 32 of sha256) as git's hex."""
    return (packed[:20] if packed[20:] == bytes(12) else packed).hex()


def _blob_matches(parent: int, name: str, oid: str, kind: str) -> bool:
    """True when the regular file ``name`` in ``parent`` hashes, as a git blob, to ``oid``
    and has the mode git checks a ``kind`` file out with: an object named by blob id is used
    only so."""
    try:
        fd, st = fsopen.open_regular(name, parent)
    except OSError:
        return False
    hasher = hashlib.sha256() if len(oid) == 64 else hashlib.sha1()  # noqa: S324
    hasher.update(f"blob {st.st_size}\0".encode())
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            hasher.update(chunk)
    return hasher.hexdigest() == oid and st.st_mode & 0o777 == _MODES[kind]


class _Checkout:
    """Fills one checkout tree from git's objects, linking what a base lower holds."""

    def __init__(self, store: Store, objects: ObjectReader, root: Path,
                 base: tuple[Path, dict[str, tuple[bytes, bytes]]] | None) -> None:
        self.store = store
        self.objects = objects
        self.root = root
        self.base = base
        self.rows: dict[str, tuple[object, ...]] = {}
        self._base_fd = -1

    def fill(self, tree: str) -> dict[str, tuple[object, ...]]:
        """The checkout of ``tree`` made under ``root``: its records' rows. A submodule is
        an empty folder, as git checks one out that was never cloned (without it, ``git
        add -A`` in a worktree would record the submodule deleted)."""
        files, dirs = [], set()
        for rel, kind, oid in self.objects.entries(tree):
            try:
                parts = fsopen.split(rel)
            except OSError:
                continue  # a crafted tree entry ("..", "/"): git refuses to check it out too
            if any(p.lower() == ".git" for p in parts):
                continue
            if kind == "m":
                dirs.add(rel)
            else:
                files.append((rel, kind, oid))
        files.sort()
        for rel in [*(rel for rel, _kind, _oid in files), *dirs]:
            up = rel.rpartition("/")[0]
            while up and up not in dirs:
                dirs.add(up)
                up = up.rpartition("/")[0]
        wanted = {rel: (kind, oid) for rel, kind, oid in files}
        objs = {k: self._objects_dir(k) for k in _KINDS.values()}
        self._base_fd = fsopen.open_dir(self.base[0]) if self.base is not None else -1
        try:
            with fsopen.DirCursor(self.root) as cursor:
                for rel in sorted(dirs | wanted.keys()):
                    parts = rel.split("/")
                    parent = cursor.dir(parts[:-1])
                    if rel in dirs:
                        os.mkdir(parts[-1], 0o755, dir_fd=parent)
                        os.chmod(parts[-1], 0o755, dir_fd=parent)  # whatever the umask
                        continue
                    kind, oid = wanted[rel]
                    self._place(parent, parts[-1], rel, kind, oid, objs)
                    st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                    self.rows[rel] = (*stamp_of(st), kind.encode(),
                                      bytes.fromhex(oid).ljust(32, b"\0"))
                for rel in sorted(dirs):
                    parts = rel.split("/")
                    st = os.stat(parts[-1], dir_fd=cursor.dir(parts[:-1]),
                                 follow_symlinks=False)
                    self.rows[rel] = (*stamp_of(st), _DIR, bytes(32))
        finally:
            for fd in (*objs.values(), self._base_fd):
                if fd >= 0:
                    os.close(fd)
        return self.rows

    def _objects_dir(self, kind: str) -> int:
        folder = self.store.root / "objects" / kind
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return fsopen.open_dir(folder)

    def _place(self, parent: int, name: str, rel: str, kind: str, oid: str,
               objs: dict[str, int]) -> None:
        if kind == "l":
            target = self.objects.read(oid, "blob").decode("utf-8", "surrogateescape")
            os.symlink(target, name, dir_fd=parent)
            return
        blob = bytes.fromhex(oid).ljust(32, b"\0")
        if self.base is not None and self.base[1].get(rel) == (kind.encode(), blob):
            with contextlib.suppress(OSError):  # the base lower's link: checked with it
                os.link(rel, name, src_dir_fd=self._base_fd, dst_dir_fd=parent,
                        follow_symlinks=False)
                return
        folder = objs[_KINDS[kind]]
        with contextlib.suppress(OSError):
            os.link(oid, name, src_dir_fd=folder, dst_dir_fd=parent, follow_symlinks=False)
            if _blob_matches(parent, name, oid, kind):
                return
            os.unlink(name, dir_fd=parent)
        self._write(folder, parent, name, kind, oid)

    def _write(self, folder: int, parent: int, name: str, kind: str, oid: str) -> None:
        """A new object from git's (re-hashed) blob, then linked in."""
        tmp = f".{oid}.{secrets.token_hex(4)}"
        out = fsopen.create_file(tmp, folder, _MODES[kind])
        try:
            os.fchmod(out, _MODES[kind])

            def sink(chunk: bytes) -> None:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]

            self.objects.stream(oid, "blob", sink)
        except BaseException:
            os.close(out)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
        os.close(out)
        # linked into the lower before it is named in objects/: a sweep never sees it alone
        os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=parent, follow_symlinks=False)
        os.rename(tmp, oid, src_dir_fd=folder, dst_dir_fd=folder)
