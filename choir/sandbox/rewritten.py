"""Bytecode for a sealed tree's modules, made by Choir, never by a step: pytest's rewritten test
modules, and the plain modules' compiled code.

A verifier step sees the sealed tree read-only and with no ``__pycache__`` (a planted
``.pyc`` would be loaded in place of its source: ``choir.evidence.bytecode``), so the step's
pytest rewrites the asserts of every test module on every run: networkx's 259 test modules
took 16.3 s of CPU to collect that way and 4.8 s with their rewrites kept; on a small suite
(python-slugify's 7) it is tens of milliseconds (docs/performance.md, ``bench/rewritten.py``).

pytest (9.2 on) keeps a rewritten module as a checked-hash ``.pyc`` named
``<module><PYC_TAIL>`` (the tail names the interpreter and pytest's version) in
``get_cache_dir(path)``, and fixes the code's file name when it loads one. Here such files
are kept in ``<artifacts>/pytest-cache/<tail>/<blake3 of the source>``, made by the pytest
Choir itself imports, from a sealed file's bytes, in a process that holds no key and runs
none of the tree's code (a parse, the rewrite, a compile: nothing of the source executes).

For a step of the pytest preset (its command runs ``$CHOIR_PYTEST``), the bwrap sandbox
asks ``for_step`` for a folder of this tree's test modules that have one (links, named and
placed as pytest looks for them, by their folder in the tree), binds it read-only and
names it in ``$CHOIR_PYTEST_PYC``; the preset's wrapper (``pytest_junit.py``) points
pytest's ``get_cache_dir`` there for the files under ``$CHOIR_PYTEST_ROOT``. The step's
pytest loads one only if it is the same pytest (the tail is in the name) and the source
hash in its header matches the file (pytest's own check).

What holds: the folder is bound read-only and holds only this tree's modules (never another
tree's, nor a held-out check's): it is named by exactly the links it holds (each module's
place and the blake3 of its source), so a kept one serves only a step that would get the
same links from a fresh one; no step writes it or the cache, which no sandbox sees. A file
is named by its source's blake3, so no other bytes get its code (pytest's own check is a
64-bit hash with a public key: it is not what keeps them apart). A module whose rewrite
warns (an ``assert (x, "msg")``) is left to the step, which warns as pytest does; a project
with ``enable_assertion_pass_hook`` rewrites its own (the wrapper asks its configuration),
as does a pytest of another version.

The tree's other modules (its package, a test folder's ``__init__``) are compiled the same
way: ``compile`` of a sealed file's bytes (nothing of it executes) in a checked-hash ``.pyc``
of Choir's interpreter, kept in ``<artifacts>/pytest-cache/<cache tag>.pyc/<blake3>`` and
linked into the step's folder as ``<module>.<cache tag>.pyc``; the wrapper points the import
system's ``cache_from_source`` there for sources under the root (not under ``-O``). The
interpreter loads one only if its magic number is its own and the source hash in the header
matches the file; else it compiles the source, as it would on any read-only tree. A module
whose compile warns is left to the step. networkx's collection took 0.3-0.5 s of CPU less
with its 368 plain modules' code given; a small package's (toolz's 18) is within the noise
(docs/performance.md, ``bench/rewritten.py``).

When: the warm service (``choir serve``) fills the cache after a request has answered,
for the modules its steps found none for (``fill``); a cold command only reads it, and
looks only once a service has made the folder. Both are bounded: the kept step folders
(``KEEP_STEPS``, ``_prune``) and each kind's cached files (``KEEP_OBJECTS`` and
``KEEP_OBJECT_BYTES``, ``_prune_objects``), the least recently used and the oldest made
going first.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import fcntl
import fnmatch
import functools
import importlib.util
import marshal
import os
import secrets
import shutil
import stat
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import blake3

from choir._core.paths import artifact_dir

PATTERNS = ("test_*.py", "*_test.py", "conftest.py")  # pytest's python_files, and conftest
# pytest's own ``norecursedirs`` (every folder whose name starts with a dot among them), and
# any folder holding a ``pyvenv.cfg``: a venv's packages are not the project's tests
SKIP_DIRS = (".*", "*.egg", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}")
MAX_SOURCE = 2 << 20  # bytes of one module: bigger ones are the step's to rewrite
MAX_FILES = 10_000  # modules linked for one step, and made by one fill
PENDING_BYTES = 32 << 20  # sources kept for ``fill``, at most (the tree is parked by then)
FILL_S = 10.0  # one fill's time, at most (its child is killed then)
FILL_GRACE_S = 2.0  # for the child's start and its last file
WRAPPER = ".choir"  # the step folder's own: the preset's wrapper, compiled
WRAPPER_NAME = "<string>"  # the file name its code carries, as ``python3 -c`` gives it
REFUSED = ".none"  # beside a digest: its module was refused (its rewrite or compile warns)
KEEP_STEPS = 64  # step folders kept for reuse (``_prune``): each is a few links per module
PRUNE_AFTER_S = 600.0  # a step folder used this recently is never removed
LOCK = ".lock"  # in the steps' folder: shared while a step holds a folder, taken to prune
KEEP_OBJECTS = 50_000  # cached files kept of each kind (``_prune_objects``): a few KB each
KEEP_OBJECT_BYTES = 1 << 30  # and their bytes
COUNTED = ".counted"  # in an objects folder: its time is that of the last count of its files

# (kind, digest) -> (a sealed file's path, its bytes), for ``fill``: the bytes are kept, since
# the sealed tree is parked (or gone) by the time the request has answered
_pending: dict[tuple[str, str], tuple[str, bytes]] = {}
_filling = [False]  # set in a warm service's worker (``collect``): what is missing is noted
_kept = [0]  # bytes in ``_pending``


@functools.cache
def tail() -> str | None:
    """``PYC_TAIL`` of the pytest Choir imports, or None when it keeps no checked-hash file
    (pytest before 9.2 checked its files by time and size, which another file can share).
    Read from its version alone: importing its rewrite module costs a cold command 150 ms,
    and ``fill``, which does, checks the two agree."""
    try:
        import _pytest
    except ImportError:
        return None
    numbers = tuple(getattr(_pytest, "version_tuple", ())[:2])
    if not all(isinstance(n, int) for n in numbers) or numbers < (9, 2):
        return None
    return f".{sys.implementation.cache_tag}-pytest-{_pytest.__version__}.pyc"


def compiled() -> str | None:
    """The name's end of a plain module's compiled file for this interpreter, as the import
    system names it in ``__pycache__`` (``.cpython-311.pyc``); None when it keeps none."""
    tag = sys.implementation.cache_tag
    return None if tag is None else f".{tag}.pyc"


def root() -> Path:
    return artifact_dir() / "pytest-cache"


def _objects(made: str) -> Path:
    return root() / made.lstrip(".")


def _modules(tree: Path) -> Iterator[tuple[str, str, bool]]:
    """(folder, name, a test module) of every module in ``tree``: no link followed, none
    entered."""
    for folder, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if not any(fnmatch.fnmatchcase(d, p) for p in SKIP_DIRS)
                   and not os.path.lexists(os.path.join(folder, d, "pyvenv.cfg"))]
        for name in files:
            if name.endswith(".py"):
                yield folder, name, any(fnmatch.fnmatchcase(name, p) for p in PATTERNS)


def _read(path: str) -> bytes | None:
    """A regular file's bytes, never through a link; None past ``MAX_SOURCE``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SOURCE:
            return None
        data = fh.read(MAX_SOURCE + 1)
    return data if len(data) <= MAX_SOURCE else None


@contextlib.contextmanager
def for_step(tree: Path) -> Iterator[Path | None]:
    """A folder of the cached rewrites of ``tree``'s test modules and the compiled code of
    its other modules, for one step; None when there is none to give (no cache, no module
    that has one). Those without one are noted for ``fill``.

    The folder is named by what it holds (``_key``), made once and kept: the next step of a
    tree that would get the same links (the same tree again, a rerun, a second verifier, a
    tree whose changes touch no module) binds the same folder, and no step pays for making
    and removing it (its folders' removal alone was 9 of a warm toolz request's 15 ms here).
    A folder holds exactly what a fresh one for that step would, so no tree is given
    another's code: the key is every link's place in the folder and its cached file, whose
    name is its source's blake3. Kept folders are bounded (``KEEP_STEPS``, ``_prune``)."""
    kinds = {kind: made for kind, made in (("rewritten", tail()), ("compiled", compiled()))
             if made is not None and (_filling[0] or _objects(made).is_dir())}
    if not kinds:
        yield None
        return
    steps = root() / "steps"
    _prune(steps)
    with _in_use(steps):
        try:
            folder = _step_folder(tree, steps, {kind: (str(_objects(made)), made)
                                                for kind, made in kinds.items()})
        except OSError:  # a disk that is full, a cache Choir cannot read: the step makes
            folder = None  # its own, as on any read-only tree
        yield folder


@contextlib.contextmanager
def _in_use(steps: Path) -> Iterator[None]:
    """A shared lock on ``steps``' lock file while a step may bind a folder there: a prune
    (``_prune``, exclusive) waits for no step and removes nothing while one holds it. None
    taken where the lock file cannot be made (the step's folder is then not made either)."""
    try:
        steps.mkdir(parents=True, exist_ok=True)
        fd = _lock_file(steps)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _lock_file(steps: Path) -> int:
    """A descriptor of ``steps``' lock file (made if missing), for ``flock``."""
    return os.open(steps / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _step_folder(tree: Path, steps: Path, kinds: dict[str, tuple[str, str]]) -> Path | None:
    """The kept folder in ``steps`` for ``tree``'s links (made now if none holds them yet);
    None when there is no link to give."""
    links = _links(tree, kinds)
    if not links:
        return None
    folder = steps / _key(links)
    try:
        os.utime(folder)  # kept: newest for ``_prune``
        return folder
    except FileNotFoundError:
        pass
    temp = steps / f".tmp-{secrets.token_hex(8)}"
    try:
        if not _build(temp, links):
            return None
        try:
            os.rename(temp, folder)
        except OSError:  # another step made the same folder first: that one serves
            if not folder.is_dir():
                raise
    finally:
        # Choir's own folder, which no step could write: nothing in it is a plant
        shutil.rmtree(temp, ignore_errors=True)
    return folder


def _key(links: list[tuple[str, str, str]]) -> str:
    """The name of the folder of these links: no part holds a NUL, and none is empty, so a
    double NUL ends a link and nothing else."""
    text = "\0\0".join("\0".join(link) for link in links)
    return blake3.blake3(text.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _links(tree: Path, kinds: dict[str, tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(folder in the step's folder, file name, cached file) of each of ``tree``'s modules
    for ``kinds`` (kind: its objects' folder, its files' ending) that has cached code, the
    preset's wrapper first; at most ``MAX_FILES``."""
    links = []
    if "compiled" in kinds:  # the preset's wrapper itself (``base.PYTEST_STUB``)
        wrapper = _wrapper(*kinds["compiled"])
        if wrapper is not None:
            links.append(wrapper)
    base = str(tree)
    for where, name, test in _modules(tree):
        kind = "rewritten" if test else "compiled"
        if kind not in kinds:
            continue
        objects, made = kinds[kind]
        path = os.path.join(where, name)
        data = _read(path)
        if data is None:
            continue
        cached = _cached(kind, objects, path, data)
        if cached is None:
            continue
        links.append((os.path.relpath(where, base), name[:-3] + made, cached))
        if len(links) >= MAX_FILES:
            break
    return links


def _build(folder: Path, links: list[tuple[str, str, str]]) -> int:
    """Make ``folder`` with ``links``; how many were linked."""
    made_here: set[str] = set()  # the step's folders made so far (strings: a path object
    # per module cost a networkx step more than its links)
    linked = 0
    for rel, name, cached in links:
        try:
            into = _folder(str(folder), rel, made_here)
            _link(cached, os.path.join(into, name))
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            # a tree folder named like a module's file here (``calc.cpython-311.pyc/``)
            # took its place, or the other way round: that module is compiled by the
            # step, as on any read-only tree (a link never stands where a folder is)
            continue
        linked += 1
    return linked


def _link(cached: str, to: str) -> None:
    """``to`` made a hard link to the cached file, or a read-only copy of it where the file
    has all the links the file system allows (every empty module of every kept folder
    links the one object of empty bytes: ext4 allows 65,000)."""
    try:
        os.link(cached, to)
    except OSError as exc:
        if exc.errno != errno.EMLINK:
            raise
        shutil.copyfile(cached, to, follow_symlinks=False)
        os.chmod(to, 0o444)


def _prune(steps: Path) -> None:
    """Past ``2 * KEEP_STEPS`` folders in ``steps``, remove the least recently used down to
    ``KEEP_STEPS`` (so the removal, a millisecond a folder on this disk, is paid once per
    ``KEEP_STEPS`` new folders); a leftover of a maker that died (``.tmp-``) goes then too.
    Only while no step holds a folder (``_in_use``): one being bound, or read, is never
    removed under it (a removed folder failed the step's bind: a FAIL that was no one's).
    A folder used in the last ``PRUNE_AFTER_S`` stays, used again soon."""
    try:
        entries = [entry for entry in os.scandir(steps) if entry.name != LOCK]
    except OSError:
        return
    if len(entries) <= 2 * KEEP_STEPS:
        return
    try:
        fd = _lock_file(steps)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a step holds its folder: the next step past the bound prunes
            return
        recent = time.time() - PRUNE_AFTER_S
        aged = _by_age(entries)
        for mtime, _size, path in aged[:max(len(aged) - KEEP_STEPS, 0)]:
            if mtime < recent:
                shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)


def _prune_objects(objects: Path) -> None:
    """Past ``2 * KEEP_OBJECTS`` files or twice ``KEEP_OBJECT_BYTES`` in ``objects`` (one
    kind's cached code), remove the oldest made down to both bounds, none made in the last
    ``PRUNE_AFTER_S``; counted at most once per ``PRUNE_AFTER_S`` (a count reads the
    folder: tens of milliseconds at 100,000 files). Called by ``fill``, off any request's
    path. A file removed goes from the cache only: a kept step folder's link to it stays (a
    hard link) until the folder goes; a step linking it as it goes gets no folder and
    compiles its own (``for_step``), and a later fill makes it again."""
    counted = objects / COUNTED
    try:
        if time.time() - counted.stat().st_mtime < PRUNE_AFTER_S:
            return
    except FileNotFoundError:
        pass
    except OSError:
        return
    try:
        try:
            os.utime(counted)
        except FileNotFoundError:  # read-only, as every file of the cache is
            os.close(os.open(counted, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o444))
        aged = _by_age([entry for entry in os.scandir(objects) if entry.name != COUNTED])
    except OSError:
        return
    count, size = len(aged), sum(size for _mtime, size, _path in aged)
    if count <= 2 * KEEP_OBJECTS and size <= 2 * KEEP_OBJECT_BYTES:
        return
    recent = time.time() - PRUNE_AFTER_S
    for mtime, each, path in aged:
        if mtime >= recent or (count <= KEEP_OBJECTS and size <= KEEP_OBJECT_BYTES):
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            count, size = count - 1, size - each


def _by_age(entries: list[os.DirEntry[str]]) -> list[tuple[float, int, str]]:
    """Each entry's time of last change, size and path, the oldest first."""
    aged = []
    for entry in entries:
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            aged.append((st.st_mtime, st.st_size, entry.path))
    aged.sort()
    return aged


def _wrapper(objects: str, made: str) -> tuple[str, str, str] | None:
    """The link of the compiled pytest preset's wrapper: ``WRAPPER/pytest<made>`` (a folder
    no tree module's can be: a walk enters no folder whose name starts with a dot); None
    when it has none yet (noted for ``fill`` then)."""
    from choir.sandbox.base import pytest_source

    cached = _cached("compiled", objects, WRAPPER_NAME, pytest_source().encode("utf-8"))
    return None if cached is None else (WRAPPER, "pytest" + made, cached)


def _cached(kind: str, objects: str, path: str, data: bytes) -> str | None:
    """The cached file of ``kind`` in ``objects`` for a module of these bytes; None when
    there is none (noted for ``fill`` then, unless refused before or past the bounds)."""
    digest = blake3.blake3(data).hexdigest()
    cached = os.path.join(objects, digest)
    if os.path.isfile(cached):
        return cached
    if (_filling[0] and (kind, digest) not in _pending
            and not os.path.lexists(cached + REFUSED)
            and len(_pending) < MAX_FILES
            and _kept[0] + len(data) <= PENDING_BYTES):
        _pending[kind, digest] = (path, data)
        _kept[0] += len(data)
    return None


def _folder(top: str, rel: str, made: set[str]) -> str:
    """``top/rel``, each folder made readable by the sandbox's user (whatever the umask);
    ``made`` holds those made already."""
    here = top if rel == "." else os.path.join(top, rel)
    if here in made:
        return here
    if top not in made:
        os.makedirs(top)
        os.chmod(top, 0o755)
        made.add(top)
    path = top
    for part in ([] if rel == "." else rel.split(os.sep)):
        path = os.path.join(path, part)
        if path not in made:
            os.mkdir(path)
            os.chmod(path, 0o755)
            made.add(path)
    return here


def _made(data: bytes, filename: str) -> bytes | None:
    """The file pytest would keep for a module of these bytes; None when its rewrite
    warns or fails (the step's pytest then rewrites it and says what it says)."""
    import io

    from _pytest.assertion.rewrite import _write_pyc_fp, rewrite_asserts

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            tree = ast.parse(data, filename=filename)
            rewrite_asserts(tree, data, filename, None)
            code = compile(tree, filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
    if said:
        return None
    out = io.BytesIO()
    _write_pyc_fp(out, importlib.util.source_hash(data), code)
    return out.getvalue()


def _compiled(data: bytes, filename: str) -> bytes | None:
    """The checked-hash ``.pyc`` the interpreter would keep for a plain module of these
    bytes (``py_compile``'s, unoptimised); None when its compile warns or fails (the step
    compiles it then, and says what it says)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            code = compile(data, filename, "exec", dont_inherit=True, optimize=0)
        except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
            return None
    if said:
        return None
    return (importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little")
            + importlib.util.source_hash(data) + marshal.dumps(code))


def collect() -> None:
    """Note the modules the steps of this process find no rewrite for: a warm service's
    worker, which ``fill``s them once its request has answered."""
    _filling[0] = True


def fill(limit_s: float = FILL_S) -> int:
    """Make the cached code of every module the steps of this process found none for; how
    many were made. Called by a warm service's worker once its request has answered.

    The making runs in a child process, killed at ``limit_s`` (and held to that much CPU):
    a compile is not interrupted from within, and a tree's module can take minutes to
    compile (``def f(): return 1`` repeated is quadratic in CPython 3.11: 2 MiB of it took
    590 s), holding a worker of the service all that time."""
    import subprocess

    if not _pending:
        return 0
    jobs = [(kind, digest, os.path.basename(path), data)
            for (kind, digest), (path, data) in _pending.items()]
    _pending.clear()
    _kept[0] = 0
    top = root()
    endings = {"compiled": compiled(), "rewritten": tail()}
    targets = [_objects(ending) / digest for kind, digest, _name, _data in jobs
               if (ending := endings.get(kind)) is not None]
    before = {target for target in targets if target.exists()}
    child = subprocess.Popen(
        [sys.executable, "-c", "from choir.sandbox.rewritten import _fill_child; _fill_child()"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child.communicate(marshal.dumps((str(top), jobs, limit_s)),
                          timeout=limit_s + FILL_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    for temp in top.glob(f"*/.*.{child.pid}"):  # what a killed child was writing
        temp.unlink(missing_ok=True)
    for objects in (_objects(ending) for ending in endings.values() if ending is not None):
        if objects.is_dir():
            _prune_objects(objects)
    return sum(1 for target in targets if target not in before and target.is_file())


def _fill_child() -> None:
    """``fill``'s child: the modules on stdin made into the cache."""
    import math
    import resource

    top, jobs, limit_s = marshal.loads(sys.stdin.buffer.read())
    cpu = math.ceil(limit_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    end = time.monotonic() + limit_s
    makers = {"compiled": (compiled(), _compiled)}
    made = tail()
    if made is not None:
        from _pytest.assertion import rewrite

        if made == rewrite.PYC_TAIL and hasattr(rewrite, "_fix_code_filename"):
            makers["rewritten"] = (made, _made)  # else not the kind of file ``tail`` took
            # it for: none is made
    for kind, digest, name, data in jobs:
        ending, maker = makers.get(kind, (None, None))
        if ending is None or maker is None or time.monotonic() > end:
            continue
        objects = Path(top) / ending.lstrip(".")
        target = objects / digest
        if target.exists():
            continue
        pyc = maker(data, name)  # no tree's path in it: the loader names the code after
        # the file it loads it for
        objects.mkdir(parents=True, exist_ok=True)
        if pyc is None:  # noted, so that no later fill makes it again
            with contextlib.suppress(FileExistsError):
                os.close(os.open(objects / (digest + REFUSED),
                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444))
            continue
        temp = objects / f".{digest}.{os.getpid()}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o444)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pyc)
            os.fchmod(fh.fileno(), 0o444)  # the sandbox's user reads it, whatever the umask
        os.rename(temp, target)


__all__ = ["collect", "compiled", "fill", "for_step", "root", "tail"]
