"""Git's control files in the repo, as they were before an executor ran, put back after it.

A sandboxed executor sees the repo writable, ``.git`` included, so that it can commit. But
``.git`` also names the programs git runs: ``config`` (``core.fsmonitor``,
``core.hooksPath``, filters, pagers, editors, ``diff.external``), ``hooks/``, a
submodule's or a linked worktree's own config. Choir's own git pins every one of them
(``choir.evidence.git``); the user's does not, and a plant there ran as the user, outside
every sandbox, at their next ``git status`` (a shell prompt with git in it runs one at every
line; review 25).

So everything in ``.git`` but the history an executor may write (``HISTORY``: objects, refs,
logs, the index, HEAD and the heads of a merge or pick in progress), in ``.git``
and in every git folder below it (a folder holding a ``HEAD`` file: ``modules/<name>``,
``worktrees/<name>``), is read before the executor starts (``save``) and put back once its
sandbox has ended with every process in it (``restore``): a changed or replaced entry is
written back, an added one removed, parents before children and never through a link. A
``.git`` replaced whole (another folder, a file or a link naming another git folder) cannot
be put back: it is moved aside and the round stops, saying so.

A ``.git`` below the repo's own is a repository of its own to the user's git in that
folder (a shell prompt runs one on ``cd``, an editor scans for nested repositories): a
folder ``git init`` made, or a file naming a git folder anywhere. git never tracks one (it
refuses a ``.git`` path component), so none is part of a change, and the tree scan skips
them. So ``save`` finds every one (a walk of the work tree that enters no link, no ``.git``
and none of the folders the executor sees read-only) and guards those that were there the
same way; ``restore`` walks again and removes every one the executor added, whatever it is
(folder, file or link; a link is removed, never what it names).

The repo's config can name places in the work tree for git to run or read as well: the
hooks folder ``core.hooksPath`` names (husky's ``.husky/_``, often ignored, so a change there
shows in no diff) and the files ``include.path`` or ``includeIf.*.path`` name. The user's
next ``git commit`` ran a hook the executor wrote there, and their next ``git status`` a
``core.fsmonitor`` it added to an included file. So those places, as the config names them
before the executor runs (``_config_paths``), are kept whole too and put back as they were:
what git itself runs or reads is no part of an executor's change. A parent of one that the
executor made a link is removed (never followed) and plain folders made in its place.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from choir._core.errors import SandboxError
from choir.evidence.git import locate
from choir.evidence.store import rmtree
from choir.exceptions import UserError

HISTORY = frozenset({
    "objects", "refs", "logs", "index", "HEAD", "ORIG_HEAD", "FETCH_HEAD", "COMMIT_EDITMSG",
    "packed-refs", "shallow", "MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "MERGE_RR", "AUTO_MERGE",
    "REBASE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "BISECT_LOG", "BISECT_START",
    "BISECT_TERMS", "BISECT_EXPECTED_REV", "BISECT_ANCESTORS_OK", "BISECT_NAMES", "BISECT_RUN",
    "rr-cache", "lfs", "annex"})
"""What an executor may change in a git folder: history and its work in progress, which git
reads as data, never as a program to run. Not a rebase, cherry-pick or am in progress
(``rebase-merge/``, ``rebase-apply/``, ``sequencer/``): a rebase's todo list holds ``exec``
lines, which the user's ``git rebase --continue`` runs as the user, so one the executor
leaves is removed like any plant (one the user had before is put back)."""
MAX_BYTES = 32 << 20  # control files read into memory, at most (a real .git holds kilobytes)
MAX_ENTRIES = 100_000
QUARANTINE = ".git.choir-replaced"
NESTED_MAX = 256  # repositories below the repo's own that are guarded, at most


@dataclass(frozen=True)
class _Entry:
    kind: str  # "dir", "file", "link" or "other" (a socket or FIFO: kept, never recreated)
    mode: int
    data: bytes = b""


@dataclass
class Saved:
    """``.git`` before the executor: its identity and every control entry under it."""

    git: Path
    ident: tuple[int, int] | None = None  # (device, inode) when .git is a folder
    mode: int = 0
    top: _Entry | None = None  # .git itself when it is a file or a link
    entries: dict[str, _Entry] = field(default_factory=dict)
    gitdirs: set[str] = field(default_factory=set)  # folders whose history is not guarded
    size: int = 0
    # on the repo's own: every .git below it (by path from the repo), the folders not walked
    # (the executor's read-only ones, by identity) and those another user's modes hid
    nested: dict[str, Saved] = field(default_factory=dict)
    skip: dict[str, tuple[int, int]] = field(default_factory=dict)
    unread: frozenset[str] = frozenset()
    # on the repo's own: the places in the work tree its config names for git to run or
    # read (``_config_paths``), by path from the repo, each kept whole
    named: dict[str, Saved] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)  # the repo's folder and the named
    # places' parents: their modes, put back (with the owner's write) before any removal


def _entry(path: Path, st: os.stat_result, saved: Saved | None = None) -> _Entry:
    kind = _kind(st)
    if kind == "link":
        return _Entry("link", 0, os.fsencode(os.readlink(path)))
    if kind != "file":
        return _Entry(kind, stat.S_IMODE(st.st_mode) if kind == "dir" else stat.S_IFMT(st.st_mode))
    if saved is not None:
        saved.size += st.st_size
        if saved.size > MAX_BYTES:
            raise SandboxError(f"{saved.git} holds more than {MAX_BYTES >> 20} MiB outside "
                               "git's history (hooks, config, ...): Choir cannot keep it from "
                               "the executor; the executor was not run")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        return _Entry("file", stat.S_IMODE(st.st_mode), fh.read(MAX_BYTES + 1))


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(st.st_mode) else "other"


def _children(folder: Path, rel: str, gitdir: bool) -> Iterator[tuple[str, Path]]:
    """The entries of ``folder`` to guard, by path relative to ``.git``: all but a git
    folder's history; one at a time, so a folder of millions is never listed whole before
    the bound on entries is checked."""
    with os.scandir(folder) as it:
        for item in it:
            if not (gitdir and item.name in HISTORY):
                yield f"{rel}/{item.name}" if rel else item.name, Path(item.path)


def _is_gitdir(folder: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(folder / "HEAD").st_mode)
    except OSError:
        return False


@dataclass
class _Walk:
    """What a walk of the work tree found: every ``.git`` below the repo's own, the folders
    it could not read, and the folders of this user's it opened to read (with their modes,
    put back by ``close``)."""

    found: list[str] = field(default_factory=list)
    bare: list[str] = field(default_factory=list)  # folders git takes for a repository
    unread: list[str] = field(default_factory=list)
    opened: list[tuple[Path, int]] = field(default_factory=list)

    def close(self) -> None:
        for folder, mode in reversed(self.opened):  # the deepest first: each still reachable
            with contextlib.suppress(FileNotFoundError):
                os.chmod(folder, mode, follow_symlinks=False)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _walk(repo: Path, skip: dict[str, tuple[int, int]]) -> _Walk:
    """Every entry named ``.git`` below ``repo``'s own, by path from ``repo``: entering no
    link, no ``.git``, and no folder of ``skip`` that is still the folder it names (one the
    executor moved aside and replaced is walked). A folder of this user's that cannot be
    read or entered is opened first (the executor may have hidden a plant that way, and
    the user's git would enter it once the user did the same); one of another user's that
    cannot be read is listed in ``unread``. The caller puts the opened folders' modes back
    (``close``) once it is done with what was found."""
    walk = _Walk()
    me = os.geteuid()
    todo = [""]
    while todo:
        rel = todo.pop()
        folder = repo / rel
        try:
            st = os.lstat(folder)
            if not stat.S_ISDIR(st.st_mode):
                continue  # changed under the walk: nothing to enter
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid == me and mode & 0o700 != 0o700:
                os.chmod(folder, mode | 0o700, follow_symlinks=False)
                walk.opened.append((folder, mode))
            with os.scandir(folder) as it:
                items = [(item.name, item.is_dir(follow_symlinks=False)) for item in it]
        except OSError:
            walk.unread.append(rel)
            continue
        kinds = dict(items)
        if rel and kinds.get("HEAD") is False and kinds.get("objects") and kinds.get("refs"):
            # git's own test of a git folder: the user's git in it takes it for a
            # repository (``safe.bareRepository`` is ``all`` by default) and reads its config
            walk.bare.append(rel)
        for name, is_dir in items:
            child = f"{rel}/{name}" if rel else name
            if name == ".git":
                if rel:
                    walk.found.append(child)
            elif is_dir and not (child in skip and _identity(repo / child) == skip[child]):
                todo.append(child)
    walk.found.sort()
    walk.bare.sort()
    return walk


def save(repo: Path, skip: Iterable[Path] = ()) -> Saved:
    """``repo/.git``'s control entries, and those of every ``.git`` below it, read before an
    executor runs; ``skip``: folders inside the repo the executor sees read-only (not
    walked while they are the same folders: nothing can be planted there)."""
    saved = _save(repo / ".git")
    for rel in _config_paths(repo):
        _name(saved, repo, rel)
    for path in skip:
        ident = _identity(path)
        if path != repo and path.is_relative_to(repo) and ident is not None:
            saved.skip[str(path.relative_to(repo))] = ident
    walk = _walk(repo, saved.skip)
    try:
        saved.unread = frozenset(walk.unread)  # another user's: no executor of ours writes there
        for rel in [*walk.found, *walk.bare]:
            if len(saved.nested) >= NESTED_MAX:
                raise SandboxError(f"{repo} holds more than {NESTED_MAX} git repositories "
                                   "below its own: Choir cannot keep their control files "
                                   "from the executor; the executor was not run")
            saved.nested[rel] = _save(repo / rel)
            # a repository of its own to the user's git there
            top = os.path.dirname(rel) if rel.endswith(".git") else rel
            for named in _config_paths(repo / top, gitdir=repo / rel):
                _name(saved, repo, os.path.join(top, named))
    finally:
        walk.close()
    for rel in ["", *{os.path.dirname(rel) for rel in saved.named}]:  # the folders a place
        with contextlib.suppress(OSError):  # is removed from: their modes put back first
            st = os.lstat(repo / rel)
            if stat.S_ISDIR(st.st_mode):
                saved.modes[rel] = stat.S_IMODE(st.st_mode)
    return saved


def _name(saved: Saved, repo: Path, rel: str) -> None:
    """Keep the place ``rel`` whole in ``saved.named``; where the user reaches it through a
    link of their own in the tree (``.githooks`` -> ``scripts/hooks``), the place the link
    leads to as well (git follows it): the link itself is kept when it is the place, never
    a place behind a linked parent (the removal would follow it)."""
    if rel in saved.named:
        return
    linked = _linked_parent(repo, rel)
    if linked is None:
        saved.named[rel] = _save(repo / rel, history=False)
    else:  # the link itself is kept: one the executor replaced by a folder of its own goes
        _name(saved, repo, linked)
    root = os.path.realpath(repo)
    real = os.path.relpath(os.path.realpath(repo / rel), root)
    if real != rel and real != "." and not real.startswith("..") and \
            real.split(os.sep)[0] != ".git":
        _name(saved, repo, real)


def _save(git: Path, *, history: bool = True) -> Saved:
    """Every entry under ``git`` but, with ``history``, the history of each git folder in
    it; a place that is no folder is kept as ``top``."""
    saved = Saved(git)
    try:
        st = os.lstat(git)
    except FileNotFoundError:
        return saved
    if not stat.S_ISDIR(st.st_mode):
        saved.top = _entry(git, st, saved)
        return saved
    saved.ident, saved.mode = (st.st_dev, st.st_ino), stat.S_IMODE(st.st_mode)
    if history:
        saved.gitdirs.add("")
    todo = [("", git)]
    while todo:
        rel, folder = todo.pop()
        for child, path in _children(folder, rel, rel in saved.gitdirs):
            est = os.lstat(path)
            saved.entries[child] = _entry(path, est, saved)
            if len(saved.entries) > MAX_ENTRIES:
                raise SandboxError(f"{git} holds more than {MAX_ENTRIES} entries outside "
                                   "git's history: Choir cannot keep them from the executor; "
                                   "the executor was not run")
            if stat.S_ISDIR(est.st_mode):
                if history and _is_gitdir(path):
                    saved.gitdirs.add(child)
                todo.append((child, path))
    return saved


CONFIG_KEYS = (
    r"^(core\.(hookspath|fsmonitor|sshcommand|pager|editor|askpass|gitproxy|attributesfile)"
    r"|sequence\.editor|include\.path|includeif\..*\.path|pager\..*|diff\.external"
    r"|interactive\.difffilter|filter\..*\.(clean|smudge|process)|diff\..*\.(textconv|command)"
    r"|merge\..*\.driver|(merge|diff)tool\..*\.(cmd|path)|gpg(\..*)?\.program"
    r"|gpg\.ssh\.(defaultkeycommand|allowedsignersfile)|credential(\..*)?\.helper"
    r"|submodule\..*\.update|remote\..*\.(uploadpack|receivepack)|trailer\..*\.cmd"
    r"|sendemail\..*|uploadpack\.packobjectshook|browser\..*\.(cmd|path)|man\..*\.(cmd|path)"
    r"|web\.browser|alias\..*)$")
"""The settings that name a place git runs or reads: the hooks folder, included files, the
attributes file (which picks the filters), and every program (each of its words that is a
path in the tree)."""
INCLUDES_MAX = 64  # included files read for what they name; past that the round is refused
ENV_CONFIG = ("HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM",
              "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_COUNT", "GIT_CONFIG_PARAMETERS")


def _config_paths(repo: Path, gitdir: Path | None = None) -> list[str]:
    """Places in ``repo``'s work tree, by path from it, that its git config names for the
    user's git to run or read: the ``core.hooksPath`` folder (relative to the work tree's
    top), the ``include.path``/``includeIf.*.path`` files (relative to the file naming
    them), and each path in the tree a program setting names (a filter's, a diff driver's,
    an alias's, ``core.fsmonitor``, ...; relative to the top, where git runs them); none
    inside ``.git``, which is guarded already. Every scope the user's git reads (system,
    global, the repo's, its worktree's, and the ``GIT_CONFIG_*`` of the user's environment),
    and every included file whatever its condition (an ``onbranch:`` one the executor could
    make true by moving ``HEAD``); read by ``git config``, which runs nothing it names.
    ``gitdir``: the git folder to read where Choir's ``locate`` refuses the repository (a
    nested one borrowing objects: it is not verified, but the user's git runs there)."""
    try:
        git = locate(repo)
    except UserError:
        git = None
    if git is not None:
        root, place = os.path.normpath(git.root), {
            "GIT_DIR": str(git.git_dir), "GIT_WORK_TREE": str(git.root),
            "GIT_COMMON_DIR": str(git.common_dir)}
    elif gitdir is not None and os.path.lexists(gitdir):
        root, place = os.path.normpath(os.path.realpath(repo)), {
            "GIT_DIR": str(gitdir), "GIT_WORK_TREE": os.path.realpath(repo)}
    else:
        return []
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C", "GIT_PAGER": "cat",
           "GIT_TERMINAL_PROMPT": "0", "GIT_NO_LAZY_FETCH": "1", **place,
           **{key: value for key, value in os.environ.items()
              if key in ENV_CONFIG or key.startswith(("GIT_CONFIG_KEY_",
                                                      "GIT_CONFIG_VALUE_"))}}
    found: set[str] = set()
    reads: list[list[str]] = [["--includes"]]
    done: set[str] = set()
    while reads:
        scope = reads.pop()
        try:
            out = subprocess.run([shutil.which("git") or "git", "--no-pager", "config",
                                  *scope, "--show-origin", "-z", "--get-regexp", CONFIG_KEYS],
                                 cwd=root, env=env, capture_output=True, timeout=30,
                                 stdin=subprocess.DEVNULL).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        parts = os.fsdecode(out).split("\0")
        for origin, pair in zip(parts[0::2], parts[1::2], strict=False):
            key, _, value = pair.partition("\n")
            if key.endswith(".path") and key.startswith("include"):
                target = _included(root, origin, value)
                if target is not None and target not in done:
                    done.add(target)  # what it names, whether or not git reads it now
                    if len(done) > INCLUDES_MAX:  # git reads them all: a place named past
                        raise SandboxError(  # the bound would not be kept
                            f"{root}: its git config includes more than {INCLUDES_MAX} "
                            "files: Choir cannot keep the places they name from the "
                            "executor; the executor was not run")
                    reads.append(["--file", target])
            found.update(_named(root, origin, key, value))
    return sorted(found)


def _included(root: str, origin: str, value: str) -> str | None:
    """The included file an ``include.path`` names, as a real path, when it is a file."""
    base = _base(root, origin)
    if base is None or not value:
        return None
    path = os.path.realpath(os.path.join(base, os.path.expanduser(value)))
    return path if os.path.isfile(path) else None


def _base(root: str, origin: str) -> str | None:
    """The folder an include's relative path starts from: its file's; the top of the tree
    for the user's environment's (``command line:``); None for any other origin."""
    if origin.startswith("file:"):
        return os.path.dirname(os.path.join(root, origin[len("file:"):]))
    return root if origin.startswith("command line:") else None


def _named(root: str, origin: str, key: str, value: str) -> list[str]:
    """The places in the work tree at ``root`` that setting ``key`` = ``value`` (read from
    ``origin``) names, by path from ``root``: none outside it, in ``.git``, or for a program
    found on ``PATH``. A program's every word that is a path (``sh tools/x.sh``, ``!./x``)."""
    base = _base(root, origin)
    if base is None or not value:
        return []
    if key.endswith(".path") and key.startswith("include"):
        words = [value]
    elif key in ("core.hookspath", "core.attributesfile", "gpg.ssh.allowedsignersfile"):
        words, base = [value], root
    else:
        base = root
        try:
            words = shlex.split(value.lstrip("!"))
        except ValueError:
            words = value.lstrip("!").split()
        words = [word for word in words if not word.startswith("-") and "=" not in
                 word.partition("/")[0] and ("/" in word or
                                             os.path.lexists(os.path.join(root, word)))]
    found = []
    for word in words:
        path = os.path.normpath(os.path.join(base, os.path.expanduser(word)))
        rel = os.path.relpath(path, root)
        if rel.startswith(".."):  # named through a link to the tree (``/home`` a link)
            rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
        if rel != "." and not rel.startswith("..") and rel.split(os.sep)[0] != ".git":
            found.append(rel)
    return found


def _linked_parent(repo: Path, rel: str) -> str | None:
    """The first folder from ``repo`` down to ``rel``'s parent that is there and no plain
    folder (a link, a file), by path from ``repo``; None when there is none (a missing one
    ends the search: nothing is there to follow)."""
    parts = Path(rel).parts
    for depth in range(1, len(parts)):
        parent = os.path.join(*parts[:depth])
        try:
            if not stat.S_ISDIR(os.lstat(repo / parent).st_mode):
                return parent
        except FileNotFoundError:
            return None
    return None


def _restore_named(repo: Path, rel: str, saved: Saved) -> list[str]:
    """Put the place ``rel`` names back whole as ``saved`` holds it; what was undone, by
    path from ``repo``. A parent that is no plain folder now (a link the executor made, so
    that the user's git would follow it) is removed itself, never what it names, and plain
    folders are made in its place; a place that cannot be read (made unreadable, grown past
    the bound) counts as changed and is removed unread."""
    path = repo / rel
    undone: list[str] = []
    linked = _linked_parent(repo, rel)
    if linked is not None:
        _remove(repo / linked)
        undone.append(linked)
    try:
        now = _save(path, history=False)
        same = (now.top, now.mode, now.entries) == (saved.top, saved.mode, saved.entries) \
            and (now.ident is None) == (saved.ident is None)
    except (OSError, SandboxError):
        same = False
    if same:
        return undone
    if os.path.lexists(path):
        _remove(path)
    if saved.top is None and saved.ident is None:  # it was not there
        return [*undone, rel]
    path.parent.mkdir(parents=True, exist_ok=True)
    if saved.top is not None:
        _put(path, saved.top)
    else:
        _put(path, _Entry("dir", saved.mode | 0o700))
        for child in sorted(saved.entries):  # a folder before what it holds, writable
            entry = saved.entries[child]  # until it is filled
            if entry.kind == "dir":
                _put(path / child, _Entry("dir", entry.mode | 0o700))
            elif entry.kind != "other":
                _put(path / child, entry)
        for child in sorted(saved.entries, reverse=True):  # modes last: a folder's may
            if saved.entries[child].kind == "dir":  # deny its making
                os.chmod(path / child, saved.entries[child].mode)
        os.chmod(path, saved.mode)
    return [*undone, rel]


def _remove(path: Path) -> None:
    """Remove ``path`` whole, never through a link, with the store's removal (each folder
    under it opened first: the executor may have made one unreadable or unenterable);
    what is still there afterwards raises."""
    rmtree(path)
    if os.path.lexists(path):
        raise SandboxError(f"{path} could not be removed")


def _put(path: Path, entry: _Entry) -> None:
    if entry.kind == "dir":
        os.mkdir(path, entry.mode)
        os.chmod(path, entry.mode)
    elif entry.kind == "link":
        os.symlink(os.fsdecode(entry.data), path)
    elif entry.kind == "file":
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(entry.data)
        os.chmod(path, entry.mode)


def restore(saved: Saved) -> list[str]:
    """Put ``.git``'s control entries back as ``save`` read them, and those of every
    ``.git`` below it that was there; remove every ``.git`` below it that was not. The paths
    undone, relative to the repo. Called once the executor's sandbox has ended (nothing of
    it runs). Folder by folder from ``.git`` down, only into folders that were there before:
    each one's mode first (a folder made unreadable is read again), then what it holds.

    Raises:
        SandboxError: a ``.git`` was replaced whole; the replacement is moved aside to
            ``.git.choir-replaced`` (no git reads it there) and the round must stop.
    """
    repo = saved.git.parent
    undone: list[str] = []
    failures: list[str] = []
    for rel, mode in saved.modes.items():  # a folder made read-only kept its plant: the
        try:  # owner's write while putting back, its own mode after
            st = os.lstat(repo / rel)
            if stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) != mode | 0o700:
                os.chmod(repo / rel, mode | 0o700)
                if stat.S_IMODE(st.st_mode) != mode:
                    undone.append(rel or ".")
        except OSError:
            continue
    # the repositories below first, each on its own: a failure anywhere (the repo's own .git
    # replaced, a plant that cannot be removed) never leaves the others in place
    walk = _walk(repo, saved.skip)
    try:
        failures += [f"{rel or '.'} cannot be read: a repository planted in it would stay"
                     for rel in walk.unread if rel not in saved.unread]
        for rel in [*walk.found, *walk.bare]:
            before = saved.nested.get(rel)
            try:
                if before is None and rel.endswith(".git"):  # planted: git never tracks
                    _remove(repo / rel)  # one, so no change loses a file
                    undone.append(rel)
                elif before is None:  # a folder made to look like one: its HEAD goes, and
                    _remove(repo / rel / "HEAD")  # git takes it for none; its files stay
                    undone.append(f"{rel}/HEAD")
                else:
                    undone += _restore(before, label=rel)
            except (OSError, SandboxError) as exc:
                failures.append(f"{rel}: {exc}")
    finally:
        walk.close()
    for rel, before in sorted(saved.named.items()):  # a linked parent before what is below
        try:
            undone += _restore_named(repo, rel, before)
        except (OSError, SandboxError) as exc:
            failures.append(f"{rel}: {exc}")
    try:
        undone += _restore(saved)
    except SandboxError as exc:
        failures.insert(0, str(exc))
    except OSError as exc:
        failures.append(f".git: {exc}")
    for rel, mode in saved.modes.items():
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(repo / rel).st_mode):
                os.chmod(repo / rel, mode)
    if failures:
        raise SandboxError("what the executor left in git's control files could not all be "
                           "put back: " + "; ".join(failures[:5])
                           + (f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""))
    return sorted(undone)


def _restore(saved: Saved, label: str = ".git") -> list[str]:
    """Put one git folder's control entries back; what was undone, by path from the repo
    (``label``: the folder's own path from it)."""
    git = saved.git
    try:
        st: os.stat_result | None = os.lstat(git)
    except FileNotFoundError:
        st = None
    if saved.ident is None:  # .git was a file, a link, or absent
        if (_entry(git, st) if st is not None else None) == saved.top:
            return []
        if st is not None:
            _remove(git)
        if saved.top is not None:
            _put(git, saved.top)
        return [label]
    if st is None or not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != saved.ident:
        aside = git.with_name(QUARANTINE)
        if st is not None:
            if os.path.lexists(aside):
                _remove(aside)
            os.rename(git, aside)
        raise SandboxError(f"the executor replaced {git} (its history is not there any more); "
                           f"what it left is moved to {aside}, where no git reads it: restore "
                           ".git from a clone before running again")
    undone: list[str] = []
    failed: list[str] = []  # entries that could not be put back: the walk goes on past them
    if stat.S_IMODE(st.st_mode) != saved.mode:
        os.chmod(git, saved.mode)
        undone.append("")
    kids: dict[str, list[str]] = {}
    for rel in saved.entries:
        kids.setdefault(rel.rpartition("/")[0], []).append(rel)
    todo = [""]
    while todo:
        rel = todo.pop()
        try:
            present = dict(_children(git / rel if rel else git, rel, rel in saved.gitdirs))
        except OSError as exc:
            failed.append(f"{label}/{rel}: {exc}")
            continue
        for child, path in present.items():
            try:
                if _undo(path, saved.entries.get(child)):
                    undone.append(child)
            except (OSError, SandboxError) as exc:
                failed.append(f"{label}/{child}: {exc}")
        for child in kids.get(rel, []):
            try:
                if child not in present and saved.entries[child].kind != "other":
                    _put(git / child, saved.entries[child])
                    undone.append(child)
            except OSError as exc:
                failed.append(f"{label}/{child}: {exc}")
            if saved.entries[child].kind == "dir":
                todo.append(child)
    if failed:
        raise SandboxError("; ".join(failed[:5]))
    return sorted(f"{label}/{rel}".rstrip("/") for rel in set(undone))


def _undo(path: Path, want: _Entry | None) -> bool:
    """Put one entry back as ``want`` (None: it was not there); whether it had changed. A
    file that cannot be read (the executor made it unreadable) counts as changed: it is
    removed unread and written again, never left because its comparison failed."""
    est = os.lstat(path)
    if want is None:
        _remove(path)
        return True
    if _kind(est) == want.kind and want.kind in ("file", "link"):
        try:
            same = _entry(path, est) == want
        except OSError:
            same = False
        if same:
            return False
    elif _kind(est) == want.kind:
        if want.kind == "dir" and stat.S_IMODE(est.st_mode) != want.mode:
            os.chmod(path, want.mode)
            return True
        return False
    _remove(path)
    _put(path, want)
    return True


__all__ = ["HISTORY", "Saved", "restore", "save"]
