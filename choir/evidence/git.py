"""git is data, not code: every git call Choir makes goes through here.

An executor can write anything under the repo, ``.git`` included, and Choir runs git on that
repo outside any sandbox. So git is run only as a reader of bytes whose meaning Choir checks
itself:

* no configuration but the repo's own (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``,
  a neutral ``HOME``, nothing inherited from the caller's ``GIT_*``), and every key of it that
  names a program (``core.fsmonitor``, ``core.hooksPath``, a pager) overridden on the command
  line; readers use only plumbing commands that run no filter, textconv or hook;
* the few writes (the plan driver's worktrees, commits, merges and branch moves: ``write``)
  also pin empty every filter and merge driver the config defines, the editor, signing and
  auto gc, and a worktree Choir made is addressed through the git folder recorded when it
  was made, never through the ``.git`` an executor may since have rewritten;
* no replace refs (``GIT_NO_REPLACE_OBJECTS``) and no grafts (``GIT_GRAFT_FILE=/dev/null``):
  ``git replace B F`` must not make commit B read as F;
* the repository is located here, not by git: ``.git`` must be a real folder, or the ``.git``
  file of a linked worktree whose admin folder points back at it; a ``commondir`` in a
  plain ``.git``, a ``.git`` symlink, a ``.git`` file pointing anywhere else, and alternates
  outside the repository are refused (``UserError``), and git is told exactly where the
  repository, its common folder and the work tree are (``GIT_DIR``, ``GIT_COMMON_DIR``,
  ``GIT_WORK_TREE``), so neither ``core.worktree`` nor a ``commondir`` written since can
  move them;
* objects are hashed again as they are read (``cat-file`` does not check a loose object's
  bytes against its name), and a commit is bound to a tree by recomputing the tree's id from
  the bytes Choir copied, never by trusting git's index or tree listing.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import cast

from choir._core import fsopen, procs, warm
from choir.evidence import worktrees
from choir.exceptions import IntegrityError, UserError

# keys of the repo's config that name programs or files outside it, pinned for every call
_PINNED = (
    "core.fsmonitor=false", "core.hooksPath=/dev/null", "core.pager=cat",
    "core.untrackedCache=false", "core.excludesFile=/dev/null", "core.attributesFile=/dev/null",
    "core.sshCommand=false", "safe.directory=*", "advice.graftFileDeprecated=false",
    "protocol.allow=never", "core.askPass=false", "core.gitProxy=false",
)
# pinned for every write as well: nothing a write could start (an editor, a signer, gc)
_WRITE_PINS = (
    "core.editor=:", "sequence.editor=:", "commit.gpgSign=false", "tag.gpgSign=false",
    "gc.auto=0", "maintenance.auto=false", "submodule.recurse=false", "merge.renormalize=false",
    "diff.external=", "merge.tool=", "credential.helper=",
)
_IDENTITY = {"GIT_AUTHOR_NAME": "choir", "GIT_AUTHOR_EMAIL": "choir@localhost",
             "GIT_COMMITTER_NAME": "choir", "GIT_COMMITTER_EMAIL": "choir@localhost",
             "GIT_EDITOR": ":", "GIT_PAGER": "cat"}
_MODES = {"100644": "f", "100755": "x", "120000": "l"}
_GITLINK = "160000"  # a submodule: another repository's commit
_FOLDER = "40000"
_MAX_POINTER = 4096
_PINS: dict[str, tuple[str, ...]] = {}  # digest of the config files -> write pins
_PINS_MAX = 64
_CONFIG_MAX = 1 << 20
_PINS_LOCK = threading.Lock()
_CHUNK = 1 << 20
ASK_S = 60.0  # how long git may take over one answer (a header, or one chunk of an object)
# (common git folder, commit id) -> (its tree, its parents), from bytes that hashed to the id:
# a commit never changes, and a plan asks the same ones again (the worktree made from it, its
# merge's record), each time once a process of its own to ask
_COMMITS: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}
_COMMITS_MAX = 4096
# (process, common git folder) -> a reader kept between calls while warm caches are on, and
# the lock its user holds (``kept_objects``)
_KEPT: dict[tuple[int, str], tuple[threading.Lock, ObjectReader]] = {}
_KEPT_LOCK = threading.Lock()
_RECORDS: dict[tuple[str, str], Path] = {}  # (worktrees folder, worktree's .git) -> its record
_RECORDS_MAX = 4096


@atexit.register
def _end_kept() -> None:
    """The kept readers ended with the process (their git sees its input close)."""
    with _KEPT_LOCK:
        while _KEPT:
            _KEPT.popitem()[1][1].close()


def _git_binary() -> str:
    found = shutil.which("git")
    if found is None:
        raise FileNotFoundError("git")
    return found


def _write_pins(names: list[str]) -> list[str]:
    """``-c`` arguments: the pins of every write, and an empty program for each filter and
    merge driver ``names`` (config keys) define."""
    pins: list[str] = []
    for key in names:
        section, _, rest = key.partition(".")
        name = rest.rpartition(".")[0]
        if not name:
            continue
        if section == "filter":
            pins += [f"filter.{name}.{var}=" for var in ("clean", "smudge", "process")]
            pins.append(f"filter.{name}.required=false")
        elif section == "merge":
            pins.append(f"merge.{name}.driver=")
    return [arg for kv in (*_WRITE_PINS, *dict.fromkeys(pins)) for arg in ("-c", kv)]


@dataclass(frozen=True)
class GitRepo:
    """A repository Choir may read: its work tree, its git folder and the common folder that
    holds objects, refs and config (the git folder itself, except in a linked worktree)."""

    root: Path
    git_dir: Path
    common_dir: Path

    def env(self) -> dict[str, str]:
        """The whole environment of a git call: nothing inherited but ``PATH``."""
        return {
            "PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C", "HOME": "/nonexistent",
            "XDG_CONFIG_HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull, "GIT_ATTR_NOSYSTEM": "1",
            "GIT_NO_REPLACE_OBJECTS": "1", "GIT_GRAFT_FILE": os.devnull,
            "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0",
            # no transport at all, whatever the repo's config allows: a promisor remote
            # (a partial clone's) is fetched from when an object is missing, and its URL or
            # upload-pack can name a program (review 22c F1); Choir never fetches
            "GIT_ALLOW_PROTOCOL": "choir-none", "GIT_NO_LAZY_FETCH": "1",
            "GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(self.root),
            "GIT_COMMON_DIR": str(self.common_dir),
        }

    def argv(self, *args: str) -> list[str]:
        pinned = [arg for kv in _PINNED for arg in ("-c", kv)]
        return [_git_binary(), "--no-replace-objects", *pinned, *args]

    def run(self, *args: str, timeout: float = 60) -> bytes | None:
        """The stdout of ``git ARGS`` in the work tree, or None when it failed."""
        try:
            out = subprocess.run(self.argv(*args), cwd=self.root, env=self.env(),
                                 capture_output=True, check=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout

    def start(self, *args: str, timeout: float = 60
              ) -> tuple[Callable[[], bytes | None], Callable[[], None]]:
        """``run``, started now: (its answer, waited for; what ends it unasked). A listing
        that runs while Choir does something else (the snapshot checks its base meanwhile);
        a caller that fails before asking calls the second, or git runs on, its pipe open."""
        try:
            proc = subprocess.Popen(self.argv(*args), cwd=self.root, env=self.env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL)
        except OSError:
            return (lambda: None), (lambda: None)

        return functools.partial(procs.output, proc, timeout), functools.partial(procs.drop,
                                                                                 proc)

    def rev(self, rev: str) -> str | None:
        """The full sha of commit ``rev``, or None (unknown, or no commit yet)."""
        if rev.startswith("-"):
            return None
        out = self.run("rev-parse", "--verify", "-q", "--end-of-options", f"{rev}^{{commit}}")
        sha = out.decode("ascii", "replace").strip() if out else ""
        return sha if is_oid(sha) else None

    def head_commit(self) -> str | None:
        """The commit ``HEAD`` names (``rev("HEAD")``), read from git's files when ``HEAD``
        is a branch whose ref is a loose file holding a full id, as a commit leaves it: a git
        process less for the plan driver after each item's commit. Anything else (a
        detached or symbolic chain, a packed ref, a file that is no plain id) is asked of
        git. Nothing is followed through a link; the caller reads the commit's bytes before
        it trusts it (``commit_record``)."""
        try:
            head = fsopen.read_bytes(self.git_dir, "HEAD", 4096).decode("ascii").strip()
            if head.startswith("ref: refs/heads/"):
                sha = fsopen.read_bytes(self.common_dir, head[5:], 4096).decode("ascii")
                if is_oid(sha.strip()) and sha.endswith("\n") and sha.count("\n") == 1:
                    return sha.strip()
        except (OSError, ValueError):  # not there as a plain file: git's own answer
            pass
        return self.rev("HEAD")

    def objects(self) -> ObjectReader:
        """A reader of this repository's objects that re-hashes every object it returns."""
        return ObjectReader(self)

    @contextlib.contextmanager
    def kept_objects(self) -> Iterator[ObjectReader]:
        """A reader of this repository's objects, by id only (never ``head``), for one block.

        While the process's warm caches are on (``choir plan run``, whose driver asks for
        objects several times an item, a git process each), one reader per common folder is
        kept between blocks: git's ``cat-file`` finds objects written after it started (it
        looks a loose object up when asked, and scans for new packs on a miss). A block that
        finds it in use (another thread's) gets one of its own; a reader whose block raised
        is ended, since its pipe may still hold the rest of an object; a fork never uses its
        parent's. Otherwise the block's reader ends with it, as ``objects`` does."""
        if not warm.enabled():
            with self.objects() as reader:
                yield reader
            return
        key = (os.getpid(), str(self.common_dir))
        with _KEPT_LOCK:
            found = _KEPT.get(key)
            if found is None:  # started in the common folder: no worktree's removal moves it
                common = GitRepo(self.common_dir, self.common_dir, self.common_dir)
                found = _KEPT[key] = (threading.Lock(), ObjectReader(common))
        lock, reader = found
        if not lock.acquire(blocking=False):
            with self.objects() as own:
                yield own
            return
        try:
            yield reader
        except BaseException:
            reader.close()  # the next block's question starts git again
            raise
        finally:
            lock.release()

    # -- writing: worktrees, merges, commits and branch moves (the plan driver) -----------
    def _program_pins(self) -> list[str]:
        """``-c`` pins that empty every filter and merge driver the config defines: their
        names are arbitrary, so each one found is overridden (a filter that is empty runs
        nothing; a merge driver that is empty fails the merge, which is refused, not run).

        git reads only the repository's ``config`` and ``config.worktree`` here (``env``: no
        system or global config, and the common folder pinned by ``GIT_COMMON_DIR``, so a
        ``commondir`` planted since cannot send it to another config). Their bytes are read
        once (plain files, no link followed, at most a MiB each), git lists the names in
        exactly those bytes (``git config --file -``: a listing cannot be of other bytes
        than the ones it is kept under, whatever changes the files meanwhile), and the
        listing is kept per digest of them: the next write whose config reads the same
        bytes spawns no listing. A config that includes other files (what it includes may
        change while its own bytes do not), or one that cannot be read so, is listed by
        git from the repository on every write, as before.

        Raises:
            UserError: git could not list them (a timeout, a config it cannot parse): no
                write is made without them pinned.
        """
        files = self._config_files()
        if files is None:
            return _write_pins(self._list_names(None))
        key = hashlib.sha256(b"\0".join(b"%d:%s" % (len(f), f) for f in files)).hexdigest()
        with _PINS_LOCK:
            cached = _PINS.get(key)
        if cached is not None:
            return list(cached)
        pins = _write_pins(self._list_names(b"\n".join(files) + b"\n"))
        with _PINS_LOCK:
            _PINS[key] = tuple(pins)
            while len(_PINS) > _PINS_MAX:
                del _PINS[next(iter(_PINS))]
        return pins

    def _config_files(self) -> list[bytes] | None:
        """The bytes of the config files git reads for this repository (absent ones left
        out), or None when one cannot be kept so: not a plain file, over a MiB, or one that
        includes others."""
        found: list[bytes] = []
        for folder, name in dict.fromkeys(((self.common_dir, "config"),
                                           (self.common_dir, "config.worktree"),
                                           (self.git_dir, "config.worktree"))):
            try:
                data = fsopen.read_bytes(folder, name, _CONFIG_MAX + 1)
            except FileNotFoundError:
                continue
            except OSError:  # a link, a FIFO, a folder
                return None
            if len(data) > _CONFIG_MAX or b"include" in data.lower():
                return None
            found.append(data)
        return found

    def _list_names(self, config: bytes | None) -> list[str]:
        """The names of the filter and merge keys in ``config`` (given to git on its stdin),
        or, when None, in the repository's config as git reads it."""
        query = ("config", "-z", "--name-only", "--get-regexp", r"^(filter|merge)\.")
        argv = self.argv(*query[:1], "--file", "-", *query[1:]) if config is not None \
            else self.argv(*query)
        why = ""
        try:
            proc = subprocess.run(argv, cwd=self.root, env=self.env(), capture_output=True,
                                  timeout=60, check=False, input=config,
                                  stdin=subprocess.DEVNULL if config is None else None)
        except (OSError, subprocess.SubprocessError) as exc:
            why = str(exc)
        else:
            if proc.returncode not in (0, 1):  # 1: no filter or merge driver at all
                why = (f"exit {proc.returncode}: "
                       f"{proc.stderr.decode('utf-8', 'replace').strip()[-300:]}")
        if why:
            raise UserError(f"git config could not list the filters and merge drivers of "
                            f"{self.root} ({why}); no write is made without them pinned")
        out = proc.stdout if proc.returncode == 0 else b""
        return sorted(set(out.decode("utf-8", "surrogateescape").split("\0")) - {""})

    def write(self, *args: str, check: bool = True, timeout: float = 120,
              filters: bool = True) -> subprocess.CompletedProcess[str]:
        """``git ARGS`` that changes refs, the index or the work tree, with every program the
        repo's config can name pinned off (hooks, fsmonitor, filters, merge drivers, editor,
        signing, auto gc) and a fixed identity; its output kept, because a merge conflict's
        text is the feedback an item gets back. ``filters=False`` for a call that reads and
        writes no work-tree file (``worktree add --no-checkout``, ``read-tree``): no filter
        or merge driver can run, so the ``git config`` listing that pins them is skipped.

        Raises:
            UserError: git failed and ``check`` (its stderr, bounded).
        """
        if args[:2] == ("worktree", "remove"):
            worktrees.release(Path(args[-1]))  # an overlay Choir mounted: unmounted first
        pins = self._program_pins() if filters else \
            [arg for kv in _WRITE_PINS for arg in ("-c", kv)]
        argv = self.argv(*pins, *args)
        try:
            proc = subprocess.run(argv, cwd=self.root, env={**self.env(), **_IDENTITY},
                                  capture_output=True, text=True, errors="replace",
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            raise UserError(f"git {' '.join(args[:2])} could not run in {self.root}: "
                            f"{exc}") from None
        if check and proc.returncode != 0:
            raise UserError(f"git {' '.join(args[:2])} failed in {self.root}: "
                            f"{(proc.stderr or proc.stdout).strip()[-500:]}")
        return proc

    def add_worktree(self, path: Path, branch: str | None, start: str) -> GitRepo:
        """A fresh linked worktree at ``path`` on ``branch`` reset to ``start`` (a leftover
        one removed first), as a ``GitRepo`` whose git folder Choir located when it made it:
        whatever is later written to the worktree's own ``.git`` is never read. With no
        ``branch``, its ``HEAD`` is ``start`` itself, detached (a worktree that is only read,
        such as a merge queue head's: no branch to move, nor to delete later).

        In Choir's own mount namespace it is an overlay of the store's checkout of
        ``start`` (no file written: ``choir.evidence.worktrees``); elsewhere a checkout.
        """
        if path.exists() or path.is_symlink():
            self.write("worktree", "remove", "--force", str(path), check=False)
            if path.exists() or path.is_symlink():
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            self.write("worktree", "prune")
        made = worktrees.overlay_worktree(self, path, branch, start)
        if made is not None:
            return made
        on = ("-B", branch) if branch is not None else ("--detach",)
        self.write("worktree", "add", "-f", *on, str(path), start)
        made = self.worktree_at(path)
        if made is None:
            raise UserError(f"git worktree add made no worktree record for {path}")
        return made

    def worktree_at(self, path: Path, *, mount: bool = True) -> GitRepo | None:
        """The linked worktree of this repository at ``path``, found from this repository's
        own worktree records (never from ``path/.git``), or None. An overlay worktree made
        by another process is mounted here, unless ``mount`` is False (a caller about to
        remove it).

        The records are read newest first, and a record's pointer is resolved only when it
        names ``path`` as git writes it (the real path), before any other is: a plan makes a
        record per worktree and git forgets them at its end, so resolving every pointer of
        every record made a plan's lookups grow with the square of its items (10 ms a lookup
        at 200 records, three lookups an item). Two records naming one path (one left by a
        worktree removed without git, then made again there): the newer one is the
        worktree."""
        root = Path(os.path.realpath(path))
        admins = self.common_dir / "worktrees"
        if not root.is_dir() or not admins.is_dir():
            return None
        want = str(root / ".git")
        known = _RECORDS.get((str(admins), want))  # the record found last time, checked again
        if known is not None and known.parent == admins and _pointer(known, "gitdir") == want \
                and os.path.realpath(want) == want:
            return self._linked(root, known, mount)
        with os.scandir(admins) as found:
            records = sorted(found, key=_mtime_ns, reverse=True)
        others: list[tuple[Path, str]] = []
        for record in records:
            admin = Path(record.path)
            back = _pointer(admin, "gitdir")
            if back is None:
                continue
            if back != want:
                others.append((admin, back))
            elif os.path.realpath(admin / back) == want:
                return self._linked(root, admin, mount)
        for admin, back in others:  # a pointer written some other way (by hand, an old git)
            if os.path.realpath(admin / back) == want:
                return self._linked(root, admin, mount)
        return None

    def checked_out(self, branch: str) -> list[Path]:
        """The work trees of this repository whose HEAD is ``branch``, read from its own
        records (no git process): moving such a branch moves a person's checkout under it."""
        want = f"ref: refs/heads/{branch}"
        found = [self.common_dir.parent] if _pointer(self.common_dir, "HEAD") == want else []
        admins = self.common_dir / "worktrees"
        if admins.is_dir():
            for admin in sorted(admins.iterdir()):
                if _pointer(admin, "HEAD") == want:
                    back = _pointer(admin, "gitdir")
                    found.append(Path(back).parent if back else admin)
        return found

    def _linked(self, root: Path, admin: Path, mount: bool) -> GitRepo:
        if len(_RECORDS) >= _RECORDS_MAX:
            _RECORDS.clear()
        _RECORDS[(str(admin.parent), str(root / ".git"))] = admin
        made = GitRepo(root=root, git_dir=admin, common_dir=self.common_dir)
        if mount:
            worktrees.remount(made)  # an overlay made by another process: mounted here
        return made


def is_oid(text: str) -> bool:
    """A full object id: 40 (sha1) or 64 (sha256) lowercase hex digits."""
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)


def _mtime_ns(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_mtime_ns
    except OSError:
        return 0


def _pointer(folder: Path, name: str) -> str | None:
    """The first line of the small file ``folder/name`` (never through a link), or None."""
    try:
        data = fsopen.read_bytes(folder, name, _MAX_POINTER)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{folder / name} cannot be read as a plain file ({exc.strerror}): "
                        "fix: make it a regular file") from None
    return data.decode("utf-8", "surrogateescape").splitlines()[0].strip() if data else ""


def _refuse(path: Path, what: str) -> UserError:
    return UserError(f"{path}: {what}; Choir reads only a repository whose objects, refs and "
                     "config lie in its own .git folder (or a worktree of one): fix: clone it "
                     "plainly (git clone --no-shared) and verify the clone")


def locate(repo: Path) -> GitRepo | None:
    """The repository of work tree ``repo``, None when it has no ``.git``.

    Raises:
        UserError: ``.git`` is a symlink or special file, a ``.git`` file that is not a
            linked worktree of a repository pointing back at it, or the repository borrows
            objects or refs from outside itself (``commondir``, alternates).
    """
    root = Path(os.path.realpath(repo))
    dotgit = root / ".git"
    try:
        st = os.lstat(dotgit)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        if _pointer(dotgit, "commondir") is not None:
            raise _refuse(dotgit, "its commondir file borrows another repository")
        found = GitRepo(root=root, git_dir=dotgit, common_dir=dotgit)
    elif stat.S_ISREG(st.st_mode):
        found = _worktree(root, dotgit)
    else:
        raise _refuse(dotgit, "it is a symlink or special file, not a folder")
    _check_alternates(found)
    _check_exclude(found)
    return found


def _check_exclude(found: GitRepo) -> None:
    """Refuse an ``info`` folder or ``info/exclude`` that is a link or a special file: git
    reads the exclude file for every listing of the tree, following a link, so an executor
    that can write ``.git`` pointed it at a file the runner may read (a held-out check) and
    the names listed then told which guessed lines it holds (review 22c); a FIFO blocked."""
    for rel, want in (("info", stat.S_ISDIR), ("info/exclude", stat.S_ISREG)):
        path = found.common_dir / rel
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if not want(st.st_mode):
            kind = "folder" if rel == "info" else "file"
            raise UserError(f"{path}: it is a link or special file, and git would read what "
                            f"it names as the tree's ignore patterns\n  fix: review it (an "
                            f"executor may have planted it), then make it a plain {kind}: rm "
                            f"{path}; " + (f"mkdir {path}" if kind == "folder" else
                                           f"touch {path}"))


def _worktree(root: Path, dotgit: Path) -> GitRepo:
    """The repository of a linked worktree (``git worktree add``), checked both ways."""
    line = _pointer(root, ".git") or ""
    if not line.startswith("gitdir:"):
        raise _refuse(dotgit, "a .git file without a gitdir line")
    admin = Path(os.path.realpath(root / line[len("gitdir:"):].strip()))
    common_line = _pointer(admin, "commondir") if admin.is_dir() else None
    back = _pointer(admin, "gitdir") if admin.is_dir() else None
    common = Path(os.path.realpath(admin / common_line)) if common_line else None
    if (common is None or back is None or admin.parent != common / "worktrees"
            or os.path.realpath(admin / back) != str(dotgit)):
        raise _refuse(dotgit, f"a .git file pointing at {admin}, which is not a worktree of "
                      "a repository that points back at this folder")
    return GitRepo(root=root, git_dir=admin, common_dir=common)


def _check_alternates(found: GitRepo) -> None:
    """Refuse object stores borrowed from outside the repository and its common folder."""
    allowed = [str(found.root), str(found.common_dir)]
    pending = [found.common_dir / "objects"]
    for _ in range(6):  # git follows alternates five levels deep
        nxt = []
        for objects in pending:
            for name in ("alternates", "http-alternates"):
                path = objects / "info" / name
                try:
                    data = fsopen.read_bytes(objects, f"info/{name}", 1 << 16)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise _refuse(path, f"unreadable ({exc.strerror})") from None
                for line in data.decode("utf-8", "surrogateescape").splitlines():
                    entry = line.strip()
                    if not entry or entry.startswith("#"):
                        continue
                    real = os.path.realpath(objects / entry)
                    if not any(real == a or real.startswith(a + os.sep) for a in allowed):
                        raise _refuse(path, f"it borrows objects from {entry}")
                    nxt.append(Path(real))
        pending = nxt
    if pending:
        raise _refuse(found.common_dir / "objects", "alternates nested too deep")


class ObjectReader:
    """``git cat-file --batch``, with every object's bytes hashed again against its name."""

    def __init__(self, repo: GitRepo) -> None:
        self._repo = repo
        self._started: subprocess.Popen[bytes] | None = None  # on the first question
        # git blocks for good opening a FIFO planted in .git (an object, a ref): every read
        # of its answer is under a deadline, past which a watchdog kills it (review 18a F2)
        self._deadline = 0.0  # 0: no read waiting
        self._expired = False
        self._watched: subprocess.Popen[bytes] | None = None

    @property
    def _proc(self) -> subprocess.Popen[bytes]:
        if self._started is None:
            repo = self._repo
            self._started = subprocess.Popen(repo.argv("cat-file", "--batch"), cwd=repo.root,
                                             env=repo.env(), stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL)
        return self._started

    def start(self) -> ObjectReader:
        """Start git now, not at the first question (a caller with other work to overlap).

        Raises:
            OSError: git cannot start.
        """
        self._proc  # noqa: B018 - started as a side effect
        return self

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """End the process, if one was started (its pipes closed, then waited for; killed
        after 10 s)."""
        proc, self._started = self._started, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stream(self, oid: str, want: str, sink: Callable[[bytes], object]) -> None:
        """Feed object ``oid`` (of type ``want``) to ``sink`` in chunks, then check its hash.

        Raises:
            IntegrityError: the object is missing, of another type, or its bytes do not hash
                to its name (a planted loose object).
        """
        if not is_oid(oid):
            raise IntegrityError(f"not a git object id: {oid[:80]!r}")
        header = self._ask(oid)
        if len(header) != 3 or header[1].decode() != want or not header[2].isdigit():
            raise IntegrityError(f"git object {oid} is missing or not a {want}")
        self._body(oid, want, int(header[2]), sink)

    def _ask(self, name: str) -> list[bytes]:
        stdin, stdout = self._proc.stdin, self._proc.stdout
        assert stdin is not None and stdout is not None
        self._arm()
        try:
            stdin.write(f"{name}\n".encode())
            stdin.flush()
            line = stdout.readline(256)
        except BrokenPipeError:
            line = b""
        self._settle()
        return line.split()

    def _arm(self) -> None:
        self._deadline = time.monotonic() + ASK_S
        proc = self._proc
        if self._watched is not proc:  # one watchdog a git process (a reader used after close)
            self._watched = proc
            threading.Thread(target=self._watchdog, args=(proc,), name="choir-git-watchdog",
                             daemon=True).start()

    def _settle(self) -> None:
        """The read is over; when the watchdog ended it, say so."""
        self._deadline = 0.0
        if self._expired:
            raise IntegrityError(
                f"git did not answer within {ASK_S:.0f} s reading the objects of "
                f"{self._repo.root} (a FIFO or another special file planted in .git?)")

    def _watchdog(self, proc: subprocess.Popen[bytes]) -> None:
        while proc.poll() is None and self._started is proc:
            deadline = self._deadline
            if deadline and time.monotonic() > deadline:
                self._expired = True
                proc.kill()
                return
            time.sleep(0.25 if deadline else 0.5)

    def head(self) -> tuple[str, str] | None:
        """``(sha, tree)`` of the commit ``HEAD`` names, from its checked bytes; None when
        there is none (no commit yet). One process for what ``rev("HEAD")`` and
        ``commit_tree`` took two for (the snapshot asks it of every tree it scans).

        Raises:
            IntegrityError: what git answers is not a commit whose bytes hash to its name.
        """
        header = self._ask("HEAD^{commit}")
        if len(header) == 2 and header[1] == b"missing":
            return None
        oid = header[0].decode("ascii", "replace") if header else ""
        if len(header) != 3 or header[1] != b"commit" or not header[2].isdigit() or \
                not is_oid(oid):
            raise IntegrityError("git answered HEAD with no commit")
        parts: list[bytes] = []
        self._body(oid, "commit", int(header[2]), parts.append)
        return oid, self._parsed(oid, b"".join(parts))[0]

    def _body(self, oid: str, want: str, size: int, sink: Callable[[bytes], object]) -> None:
        """Read the ``size`` bytes that follow an object's header into ``sink``, then check
        that they hash to ``oid``."""
        stdout = self._proc.stdout
        assert stdout is not None
        hasher = hashlib.sha256() if len(oid) == 64 else hashlib.sha1()  # noqa: S324 - git's id
        hasher.update(f"{want} {size}\0".encode())
        left = size
        while left:
            self._arm()
            chunk = stdout.read(min(left, _CHUNK))
            self._settle()
            if not chunk:
                raise IntegrityError(f"git object {oid} ended early")
            hasher.update(chunk)
            sink(chunk)
            left -= len(chunk)
        self._arm()
        stdout.read(1)
        self._settle()
        if hasher.hexdigest() != oid:
            raise IntegrityError(f"git object {oid}: its bytes hash to {hasher.hexdigest()}, "
                                 "not to its name (a planted object)")

    def read(self, oid: str, want: str) -> bytes:
        """The bytes of object ``oid``, checked as ``stream`` does."""
        parts: list[bytes] = []
        self.stream(oid, want, parts.append)
        return b"".join(parts)

    def commit_tree(self, sha: str) -> str:
        """The tree commit ``sha`` records, read from its checked bytes."""
        return self.commit(sha)[0]

    def commit(self, sha: str) -> tuple[str, list[str]]:
        """The tree and the parents commit ``sha`` records, read from its checked bytes as
        git reads them: the ``parent`` lines right after ``tree``, each a full id.

        Raises:
            IntegrityError: no tree first, a parent that is no object id, or a ``parent``
                line anywhere later in the header (git would not count it: a commit crafted
                so that Choir and git disagree on its history is refused).
        """
        key = (str(self._repo.common_dir), sha)
        known = _COMMITS.get(key)
        if known is None:
            tree, parents = self._parsed(sha, self.read(sha, "commit"))
            if len(_COMMITS) >= _COMMITS_MAX:
                _COMMITS.clear()
            known = _COMMITS[key] = (tree, tuple(parents))
        return known[0], list(known[1])

    @staticmethod
    def _parsed(sha: str, data: bytes) -> tuple[str, list[str]]:
        header = data.split(b"\n\n", 1)[0].decode("ascii", "replace")
        lines = header.split("\n")
        tree = lines[0].removeprefix("tree ")
        if not lines[0].startswith("tree ") or not is_oid(tree):
            raise IntegrityError(f"git commit {sha} names no tree")
        at = 1
        while at < len(lines) and lines[at].startswith("parent "):
            at += 1
        parents = [line.removeprefix("parent ") for line in lines[1:at]]
        if not all(is_oid(p) for p in parents) or \
                any(line.startswith("parent ") for line in lines[at:]):
            raise IntegrityError(f"git commit {sha} names its parents as git would not read "
                                 "them")
        return tree, parents

    def files(self, tree: str, prefix: str = "") -> Iterator[tuple[str, str, str]]:
        """``(path, kind, blob id)`` of every file under ``tree``, from checked tree objects;
        kind is ``f``, ``x`` or ``l``, and submodules are left out (they are not files:
        ``submodules`` lists them)."""
        for path, mode, oid in self._entries(tree, prefix):
            if mode in _MODES:
                yield path, _MODES[mode], oid

    def entries(self, tree: str) -> Iterator[tuple[str, str, str]]:
        """``(path, kind, id)`` of every file and submodule under ``tree``, in one walk of
        its checked tree objects: kind ``f``, ``x``, ``l``, or ``m`` for a submodule (the
        commit of another repository, whose folder a checkout leaves empty)."""
        for path, mode, oid in self._entries(tree):
            if mode in _MODES:
                yield path, _MODES[mode], oid
            elif mode == _GITLINK:
                yield path, "m", oid

    def submodules(self, tree: str) -> dict[str, str]:
        """``{path: commit id}`` of every submodule entry under ``tree``: commits of other
        repositories, whose content is in no tree of this one."""
        return {path: oid for path, mode, oid in self._entries(tree) if mode == _GITLINK}

    def entry(self, tree: str, path: str) -> tuple[str, str] | None:
        """``(kind, blob id)`` of the file at ``path`` under ``tree`` (kind as ``files``
        gives it), reading only the folders on its way; None when no file is there."""
        *folders, name = path.split("/")
        for folder in folders:
            mode, tree = next(((m, o) for m, n, o in self._level(tree) if n == folder),
                              ("", ""))
            if mode != _FOLDER:
                return None
        mode, oid = next(((m, o) for m, n, o in self._level(tree) if n == name), ("", ""))
        return (_MODES[mode], oid) if mode in _MODES else None

    def changed(self, old: str | None, new: str, prefix: str = "") -> Iterator[str]:
        """Every path whose entry differs between trees ``old`` (None: the empty tree) and
        ``new``: added, removed or changed (a submodule's included); a folder whose id is
        the same in both is not read."""
        before = {} if old is None else {n: (m, o) for m, n, o in self._level(old)}
        after = {n: (m, o) for m, n, o in self._level(new)}
        for name in sorted(before.keys() | after.keys()):
            was, now = before.get(name), after.get(name)
            if was == now:
                continue
            was_tree = was[1] if was is not None and was[0] == _FOLDER else None
            now_tree = now[1] if now is not None and now[0] == _FOLDER else None
            if (was is not None and was_tree is None) or (now is not None and now_tree is None):
                yield f"{prefix}{name}"
            if now_tree is not None:
                yield from self.changed(was_tree, now_tree, f"{prefix}{name}/")
            elif was_tree is not None:  # a folder removed, or made a file: its files went
                yield from (path for path, _m, _o in self._entries(was_tree, f"{prefix}{name}/"))

    def _level(self, tree: str) -> Iterator[tuple[str, str, str]]:
        """``(mode, name, id)`` of each entry of ``tree`` itself (folders not walked into)."""
        data = self.read(tree, "tree")
        width = len(tree) // 2
        at = 0
        while at < len(data):
            space = data.index(b" ", at)
            nul = data.index(b"\0", space)
            mode = data[at:space].decode("ascii")
            name = data[space + 1:nul].decode("utf-8", "surrogateescape")
            oid = data[nul + 1:nul + 1 + width].hex()
            at = nul + 1 + width
            yield mode, name, oid

    def _entries(self, tree: str, prefix: str = "") -> Iterator[tuple[str, str, str]]:
        """``(path, mode, id)`` of every entry under ``tree`` but folders, walked into."""
        for mode, name, oid in self._level(tree):
            if mode == _FOLDER:
                yield from self._entries(oid, f"{prefix}{name}/")
            else:
                yield f"{prefix}{name}", mode, oid


def tree_id(files: dict[str, tuple[str, bytes]], oid_len: int) -> str:
    """The git tree id of ``{path: (kind, blob id as bytes)}``, computed here as git would.

    Comparing it with the tree a commit records binds the commit to the bytes Choir copied,
    without trusting git's index, tree listing or objects.
    """
    algo = hashlib.sha256 if oid_len == 64 else hashlib.sha1
    root: dict[str, object] = {}
    for path, entry in files.items():
        node = root
        *folders, name = path.split("/")
        for folder in folders:
            node = node.setdefault(folder, {})  # type: ignore[assignment]
        node[name] = entry
    return _tree_of(root, algo)


def _tree_of(node: dict[str, object], algo: Callable[[], hashlib._Hash]) -> str:
    rows: list[tuple[bytes, bytes]] = []
    for name, value in node.items():
        raw = name.encode("utf-8", "surrogateescape")
        if isinstance(value, dict):
            oid = bytes.fromhex(_tree_of(value, algo))
            rows.append((raw + b"/", b"40000 " + raw + b"\0" + oid))
        else:
            kind, blob = cast(tuple[str, bytes], value)
            mode = {"f": b"100644", "x": b"100755", "l": b"120000"}[kind]
            rows.append((raw, mode + b" " + raw + b"\0" + blob))
    body = b"".join(row for _key, row in sorted(rows))
    hasher = algo()
    hasher.update(b"tree %d\0" % len(body))
    hasher.update(body)
    return hasher.hexdigest()

