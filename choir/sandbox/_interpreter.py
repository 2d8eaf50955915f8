"""The interpreter the verifiers run is evidence: its path and a digest, checked across runs.

The attack this closes: an executor wrote an ignored ``.venv/bin/python3`` (or a ``.pth``, a
``sitecustomize.py``, a patched ``pytest``) into the repo's venv; the next ``choir run`` or
``choir verify`` of that repo ran it and ASSERTed a buggy tree. Pinning at run start and a
read-only venv during a sandboxed executor protect one run; between runs, and against a
``sandbox: none`` executor, nothing did.

So an interpreter inside the repo (anything the executor could have written, ignored or
not) is hashed whole: every path under its folder with its kind, mode and content, links by
their target, ``__pycache__`` included (a planted ``.pyc`` with a matching header is loaded).
Its digest must equal the one recorded when it was trusted (``trust``): the first use
records it, ``choir trust-interpreter`` records it again after a deliberate change
(``pip install``); any other change is refused before a step runs. An interpreter outside
the repo is not the executor's to change: it is recorded by what it reads at start-up (the
binary, ``pyvenv.cfg``, ``.pth`` files, ``sitecustomize``/``usercustomize``), which is cheap.

Hashing reads every file once; after that a file is re-read only when its stat changes
(device, inode, size, mtime and ctime: ctime cannot be set back by an unprivileged process).
The per-file cache lives under ``CHOIR_HOME`` (out of an executor's reach; one that can
write there can read the signing key anyway); ``full=True`` ignores it.

A venv of a few thousand files still costs a ``stat`` and a row of Python per file on every
run, on the interpreter lock the snapshot's thread needs at the same time. So each digest
is recorded with the moment its rows began, less ``RACY_S``, and the next measure asks one
``find -newerct`` process (on another core, printing nothing unless it finds one) whether
any path under the folders changed since (ctime: a write, a chmod, a rename, a link made or
removed, anything added to or removed from a folder changes it or its folder's, and no
unprivileged process can set it back). None did, the folders are the same inodes and the
files outside them older too, and the wall clock has run as the boot clock did since (a
clock set back would stamp a later change before the moment recorded): the digest is the
recorded one. ``RACY_S`` is git's
racy-timestamp rule: ctime moves by the kernel's clock tick, so a write in the tick of the
rows' read keeps the ctime they saw; the margin puts every such write after the moment
recorded. The per-file cache follows the same rule: a file whose ctime is that recent is
hashed and not kept (a second write in the tick of the read, its mtime set back, would
otherwise match the entry with other bytes).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from choir._core.canonical import blake3_hex
from choir._core.paths import choir_home
from choir.exceptions import UserError
from choir.models import Interpreter
from choir.sandbox._toolchain import Toolchain
from choir.sandbox.base import walk

STARTUP = ("sitecustomize.py", "usercustomize.py")
FIND = "/usr/bin/find"
LISTED = "\0digest"  # the cache's entry for the whole measure: no path holds a NUL
RACY_S = 2.0  # a change this close to a read may keep the ctime the read saw
_MEMO: dict[str, dict[str, list[int | str]]] = {}  # cache file -> entries, this process
_DIRTY: set[int] = set()  # caches with entries not yet saved (by id)
_MEMO_STAT: dict[str, tuple[int, ...]] = {}  # cache file -> its stat when read
_LOCK = threading.RLock()  # the caches above, and the records, one measure at a time


def python_of(tools: Toolchain) -> str:
    """The interpreter a step's ``python3`` resolves to: the first PATH head that has one."""
    for head in tools.path_head:
        if os.path.exists(f"{head}/python3"):
            return f"{head}/python3"
    return f"{tools.path_head[0]}/python3" if tools.path_head else "python3"


def _inside(path: str, repo: Path) -> bool:
    real, root = Path(os.path.realpath(path)), Path(os.path.realpath(repo))
    return real == root or root in real.parents


def _file_hash(path: str, st: os.stat_result, cache: dict[str, list[int | str]],
               full: bool) -> str:
    key = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    known = cache.get(path)
    if not full and known is not None and known[:5] == key:
        return str(known[5])
    import blake3

    hasher = blake3.blake3()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            hasher.update(chunk)
    digest = hasher.hexdigest()
    if st.st_ctime < time.time() - RACY_S:  # settled: a later write moves its ctime
        cache[path] = [*key, digest]
        _DIRTY.add(id(cache))
    return digest


def _row(path: str, rel: str, cache: dict[str, list[int | str]], full: bool,
         st: os.stat_result | None = None) -> str:
    """One path as hashed: kind, mode and content (a link: its target, never followed)."""
    try:
        st = st or os.lstat(path)
    except OSError:
        return f"-\0{rel}"
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return f"L\0{rel}\0{os.readlink(path)}"
    if stat.S_ISDIR(st.st_mode):
        return f"D\0{rel}\0{mode:o}"
    if stat.S_ISREG(st.st_mode):
        return f"F\0{rel}\0{mode:o}\0{_file_hash(path, st, cache, full)}"
    return f"O\0{rel}\0{st.st_mode:o}"


def _tree_rows(root: str, cache: dict[str, list[int | str]], full: bool) -> list[str]:
    """Every path under ``root`` as a row.

    Raises:
        UserError: a folder there cannot be listed: what it holds could change unseen, and
            Python still imports the names it knows from it.
    """
    try:
        return _rows(root, cache, full)
    except OSError as exc:
        raise UserError(f"the interpreter's folder {exc.filename or root} cannot be listed "
                        f"({exc.strerror}): Choir hashes every file the interpreter may run, "
                        "and cannot see what this one holds; fix: chmod u+rx it (then 'choir "
                        "trust-interpreter --repo REPO' if you changed it yourself)") from None


def _rows(root: str, cache: dict[str, list[int | str]], full: bool) -> list[str]:
    skip = len(root) + 1
    return [_row(path, path[skip:], cache, full, st) if st else f"-\0{path[skip:]}"
            for path, st in walk(root, ordered=True, strict=True)]


def _folders(roots: list[str]) -> list[list[int | str]] | None:
    """Each root with its device and inode (None: one is gone)."""
    found: list[list[int | str]] = []
    for root in roots:
        try:
            st = os.stat(root)
        except OSError:
            return None
        found.append([root, st.st_dev, st.st_ino])
    return found


def _clock() -> list[str | float]:
    """This boot's id and the time since it began (``CLOCK_BOOTTIME``, which no one sets)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ""
    return [boot, time.clock_gettime(time.CLOCK_BOOTTIME)]


def _steady(recorded: object, since: float) -> bool:
    """Whether the wall clock ran as the boot clock did since ``recorded`` (``_clock``, taken
    at ``since + RACY_S``): a change's ctime is wall-clock time, so a clock set back after the
    record would stamp a later change before ``since``, and ``find -newerct`` would miss it."""
    if not isinstance(recorded, list) or len(recorded) != 2 or not recorded[0]:
        return False
    boot, at = _clock()
    if boot != recorded[0] or not isinstance(recorded[1], (int, float)):
        return False
    return abs((time.time() - since - RACY_S) - (float(at) - recorded[1])) < 1.0


def _unchanged(roots: list[str], outside: list[str], since: float) -> bool:
    """Whether no path under ``roots`` (themselves included), nor any of ``outside``,
    changed after ``since`` (epoch seconds), by ctime. False when it cannot be told (no
    ``find`` here, or it failed)."""
    for root in roots:
        try:
            out = subprocess.run([FIND, root, "-newerct", f"@{since:.6f}", "-print", "-quit"],
                                 stdin=subprocess.DEVNULL, capture_output=True,
                                 env={"LC_ALL": "C"}, check=False)
        except OSError:
            return False
        if out.returncode != 0 or out.stdout or out.stderr:
            return False
    try:
        return all(os.lstat(path).st_ctime < since for path in outside)
    except OSError:
        return False


def _startup_files(venv: str | None, base: str) -> list[str]:
    """What an interpreter reads at start-up: ``pyvenv.cfg`` and the site folders' ``.pth``
    and customize files (the stdlib itself is the installation's, outside the repo)."""
    found = [f"{venv}/pyvenv.cfg"] if venv else []
    for prefix in (p for p in (venv, base) if p):
        for lib in sorted(Path(prefix).glob("lib/python3*/site-packages")):
            found += sorted(str(p) for p in lib.iterdir()
                            if p.suffix == ".pth" or p.name in STARTUP)
    return found


def _cache_file(key: str) -> Path:
    return choir_home() / "cache" / "interpreters" / f"{blake3_hex(key.encode())[:32]}.json"


def _stat_key(path: Path) -> tuple[int, ...]:
    try:
        st = path.stat()
    except OSError:
        return ()
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _load_cache(path: Path) -> dict[str, list[int | str]]:
    """The per-file cache at ``path``: this process's memo of it while the file is the one
    the memo was read from (its stat), else the file read again (another process saved
    more since: a service's memo would otherwise re-hash what it lacks on every request)."""
    seen = _stat_key(path)
    memo = _MEMO.get(str(path))
    if memo is not None and _MEMO_STAT.get(str(path), seen) == seen:
        return memo
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        loaded = {}
    _MEMO[str(path)] = loaded if isinstance(loaded, dict) else {}
    _MEMO_STAT[str(path)] = seen
    return _MEMO[str(path)]


def preload(limit: int = 16) -> int:
    """Read the ``limit`` newest per-file caches into this process's memo now; how many.

    For ``choir serve``, before it forks its workers: each request's vouch would otherwise
    parse its interpreter's cache again (a JSON of a few thousand entries, 4 ms measured for a
    venv's 2,674 files). A memo older than the file on disk only costs a re-hash of the
    files whose stat changed since, never a wrong digest (``_file_hash`` checks the stat)."""
    folder = choir_home() / "cache" / "interpreters"
    try:
        found = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)[-limit:]
    except OSError:
        return 0
    for path in found:
        _load_cache(path)
    return len(found)


def _save(path: Path, data: object) -> None:
    """Write ``data`` as JSON atomically (a concurrent reader sees the old or the new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _reached_from(repo: Path, tools: Toolchain, base: str) -> list[str]:
    """The interpreter's folders an executor could have changed: those inside the repo, and
    a venv the repo's ``.venv`` leads to (a link an executor swapped to a folder of its own)."""
    roots = [r for r in (tools.venv, base) if r and _inside(r, repo)]
    link = repo / ".venv"
    if tools.venv and os.path.islink(link) and \
            os.path.realpath(link) == os.path.realpath(tools.venv):
        roots.append(tools.venv)
    return list(dict.fromkeys(os.path.realpath(r) for r in roots))


def measure(tools: Toolchain, repo: Path, *, full: bool = False) -> Interpreter:
    """The interpreter ``tools`` runs, hashed (its whole folder when the repo reaches it).

    ``trust`` is ``outside-repo`` or, for one in the repo, ``first-use`` until ``vouch``.
    One at a time in a process: vouches run in threads of their own
    (``open_sandbox(beside=True)``) and share the per-file caches.
    """
    with _LOCK:
        return _measure(tools, repo, full=full)


def _measure(tools: Toolchain, repo: Path, *, full: bool) -> Interpreter:
    python = python_of(tools)
    binary = os.path.realpath(python)
    base = os.path.dirname(os.path.dirname(binary))
    roots = _reached_from(repo, tools, base)
    cache_key = os.path.realpath(tools.venv) if tools.venv else binary
    cache = {} if full else _load_cache(_cache_file(cache_key))
    outside = [] if roots else _startup_files(tools.venv, base)
    if not any(_inside(binary, Path(r)) for r in roots):
        outside.append(binary)  # what the venv's link resolves to
    folders = None if full or not roots else _folders(roots)
    known: Any = cache.get(LISTED)
    if folders is not None and isinstance(known, list) and len(known) == 6 and \
            known[0] == folders and known[1] == outside and \
            isinstance(known[2], (int, float)) and _steady(known[5], known[2]) and \
            _unchanged(roots, outside, known[2]):
        digest, files = str(known[3]), int(known[4])
    else:
        since = time.time() - RACY_S  # before the first read of the rows
        clock = _clock()
        rows: list[str] = []
        for root in roots:
            rows.append(f"R\0{root}")
            rows += _tree_rows(root, cache, full)
        rows += [_row(path, path, cache, full) for path in outside]
        digest, files = blake3_hex("\n".join(rows).encode()), len(rows)
        if folders is not None:
            record: Any = [folders, outside, since, digest, files, clock]
            cache[LISTED] = record
            _DIRTY.add(id(cache))
    if not full and id(cache) in _DIRTY:
        _DIRTY.discard(id(cache))
        saved = _cache_file(cache_key)
        _save(saved, cache)
        _MEMO_STAT[str(saved)] = _stat_key(saved)  # the memo is what the file holds now
    return Interpreter(python=python, venv=tools.venv, digest=digest,
                       files=files, scope="tree" if roots else "startup",
                       in_repo=bool(roots), trust="first-use" if roots else "outside-repo")


def _trust_file(repo: Path) -> Path:
    """One record per repo: which interpreter it runs, and that interpreter's digest. Keyed by
    the repo, not the interpreter, so a swap to another folder is a change, not a first use."""
    key = os.path.realpath(repo)
    return choir_home() / "trust" / "interpreters" / f"{blake3_hex(key.encode())[:32]}.json"


def _record(found: Interpreter, repo: Path) -> None:
    _save(_trust_file(repo), {"repo": os.path.realpath(repo), "python": found.python,
                              "venv": found.venv, "digest": found.digest, "files": found.files,
                              "trusted_at": datetime.now(UTC).isoformat()})


def trust(tools: Toolchain, repo: Path) -> Interpreter:
    """Record the interpreter ``repo`` runs now, fully re-hashed, as the trusted one."""
    with _LOCK:  # the caches and the records, as in ``vouch``
        _MEMO.clear()  # read the files, not what this process cached
        found = measure(tools, repo, full=True)
        _record(found, repo)
    return found.model_copy(update={"trust": "trusted" if found.in_repo else "outside-repo"})


def refuse_reached(tools: Toolchain, repo: Path) -> None:
    """Refuse an interpreter the repo reaches (PARANOID), from its folders alone: nothing is
    hashed, so ``open_sandbox`` says it at once even when the vouch itself runs in a thread
    of its own.

    Raises:
        UserError: the repo reaches the interpreter (it lies in the repo, or its ``.venv``
            leads to it).
    """
    python = python_of(tools)
    base = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    if _reached_from(repo, tools, base):
        raise UserError(f"the mood refuses the interpreter {tools.venv or python}: the repo "
                        "reaches it, it is outside the tree hash and an executor could have "
                        "changed it; set sandbox.python in choir.yaml to an interpreter outside "
                        "the repo")


def vouch(tools: Toolchain, repo: Path, *, refuse_in_repo: bool = False) -> Interpreter:
    """The interpreter ``tools`` runs, checked against the one trusted for ``repo``.

    Raises:
        UserError: it lies in the repo's reach and ``refuse_in_repo`` (PARANOID), or it is
            not the interpreter, or not the digest, trusted for the repo (it changed since:
            an executor may have planted code there).
    """
    with _LOCK:  # its trust record read and written under the caches' lock as well
        return _vouch(tools, repo, refuse_in_repo=refuse_in_repo)


def _vouch(tools: Toolchain, repo: Path, *, refuse_in_repo: bool) -> Interpreter:
    if refuse_in_repo:
        refuse_reached(tools, repo)
    found = measure(tools, repo)
    if not found.in_repo:
        # no interpreter in the repo is a trusted state too: without a record, a `.venv` an
        # executor made later was trusted on first use (a review ran it: a buggy tree PASSed)
        if not os.path.lexists(_trust_file(repo)):
            _record(found, repo)
        return found
    where = found.venv or found.python
    try:
        trusted = json.loads(_trust_file(repo).read_text())
    except FileNotFoundError:
        _record(found, repo)
        return found
    except (OSError, ValueError) as exc:
        raise UserError(f"the interpreter trust record of {repo} is unreadable ({exc}); run "
                        f"'choir trust-interpreter --repo {repo}' to record it again") from None
    was = (trusted.get("python"), trusted.get("digest"))
    if was != (found.python, found.digest):
        raise UserError(
            f"the interpreter {where} that the repo runs is not the one trusted for it "
            f"({was[0]}, digest {str(was[1])[:12]}; now {found.python}, digest "
            f"{found.digest[:12]}): an executor may have planted code there. If you changed "
            f"it yourself (pip install), run 'choir trust-interpreter --repo {repo}'; else "
            "recreate the venv")
    return found.model_copy(update={"trust": "trusted"})
