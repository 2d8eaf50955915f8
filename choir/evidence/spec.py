"""The spec: the files that define success, pinned when a run starts, and what verifiers read.

An executor that can edit the tests can make any tree pass: weaken the failing assertion,
delete the test, plant a ``conftest.py`` that marks every report passed, deselect it in
``pytest.ini``, plant a ``sitecustomize.py``, rewrite a postcondition verifier. So the files
the checks are made of (``choir.yaml`` ``spec:``, globs) are pinned from the tree a
``choir run`` starts on, each stored content-addressed in the artifact store and listed in a
manifest whose hash the run checkpoints (``pin_spec``). Verifiers then never read the
executor's spec: each round's sealed snapshot is copied into a *view* (``ensure_view``) in
which every pinned file is the pinned version (restored if deleted) and every new
spec-matching file is gone. New files the work item's ``may_change_spec`` admits are extra
evidence, never a replacement for a pinned check: the pinned checks run in a view without
them too (a new test module could patch the code under test at import), and the admitted
additions in a second view beside them; both must pass (``ADDITIONS_REPLICA``). A new file
that changes how every check runs (a ``conftest.py``, ``sitecustomize.py``, ``.pth``, test
configuration) is never an addition. This is what SWE-bench's harness does when it resets the
test files before grading.

``compare`` says how the executor's tree differs from the pin (``SpecChange``); the loop
refuses to ASSERT a tree whose spec changed outside ``may_change_spec``, and a change inside
it is refused or held for a person by the mood's ``spec_change`` policy.
"""

from __future__ import annotations

import collections
import difflib
import errno
import itertools
import os
import posixpath
import re
import secrets
import stat
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from choir._core import fsopen
from choir._core.canonical import blake3_hex, canonical_json
from choir._core.globs import glob_regex
from choir.config import ALWAYS_SPEC, LINT_CONFIG
from choir.config.policy import SpecPolicy
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import inspect_tree, remove_snapshot, snapshot
from choir.exceptions import IntegrityError
from choir.models import SpecChange

# New files that change how every check runs: never admitted as an addition (pytest 9 reads
# ``pytest.toml`` and ``.pytest.toml`` too: a review loaded a plugin through one), and what
# is pinned whatever ``spec:`` says (``choir.yaml``, and where Python looks). A new one of
# ``TEST_CONFIG``, the test configuration and hooks a person reads in a pull request, is held
# for approval; the rest (the interpreter's start-up, plugin metadata, where Python looks)
# stand in for the harness, and a new one is refused, approved or not.
TEST_CONFIG = ("conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
               "tox.ini", "setup.cfg", "pyproject.toml", *LINT_CONFIG)
INFLUENCE = (*TEST_CONFIG, "sitecustomize.py", "usercustomize.py", "*.pth", "*.dist-info/",
             "*.egg-info/", *ALWAYS_SPEC)
# Module names a new file must not take where imports start (the repo's root and ``src/``,
# which ``python -m`` and ``PYTHONPATH=.``/``src`` put before site-packages and most of the
# standard library): a ``pytest.py`` there is what ``python -m pytest`` runs, an ``xml/``
# package is what pytest's junit writer imports. Only new names count: a folder the base
# tree already has (a project's own ``code/``) is the project's, not a plant.
SHADOWED = frozenset(sys.stdlib_module_names) | {
    "pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "xdist", "hypothesis",
    "coverage", "pytest_cov", "nose", "nose2", "tox", "mypy", "ruff", "pylint", "flake8",
    "sitecustomize", "usercustomize",  # imported at every start from anywhere on the path
    # what pytest imports as it runs (a review's ``pygments/`` hooked its reports)
    "pygments", "colorama", "exceptiongroup", "tomli", "certifi", "_hypothesis_pytestplugin",
    # imported by a ``.pth`` in site-packages at every start of the interpreter, after
    # PYTHONPATH is on the path (a review's ``_distutils_hack.py``, setuptools', ran before
    # pytest): virtualenv's, and coverage's process start-up
    "_distutils_hack", "_virtualenv", "_coverage_pth"}
# a plugin's name, or pytest's own; setuptools' editable installs' finders, which their
# ``__editable__.*.pth`` imports at every start
SHADOWED_PREFIXES = ("pytest_", "_pytest", "__editable__", "_editable_impl_")
# what other editable installs' ``.pth`` files import at every start: meson-python's
# ``_NAME_editable_loader`` (numpy's, scipy's development installs), scikit-build-core's
# ``_NAME_editable``
_SHADOWED_PATTERN = re.compile(r"_\w*_editable(?:_loader)?")


def shadowed(module: str) -> bool:
    """Whether a new module of this name at an import root would be imported in place of
    one the runner or the interpreter's start-up imports."""
    return module in SHADOWED or module.startswith(SHADOWED_PREFIXES) or \
        _SHADOWED_PATTERN.fullmatch(module) is not None
# compiled files are never part of a view: Python loads a ``__pycache__`` file (or one
# compiled with an unchecked hash) instead of the pinned source beside it
_COMPILED = (".pyc", ".pyo")
# A file Python's path finder loads a module from, under any interpreter a step may run: the
# source, a sourceless ``NAME.pyc`` sitting in the folder itself (a review's fake
# ``pytest.pyc`` ran as pytest), or an extension, whatever its ABI tag
# (``NAME.cpython-312-x86_64-linux-gnu.so``, ``NAME.abi3.so``). The module is the name up
# to the first dot: a tag is any middle part, and a name that holds a dot is no module
# (counting it as its first part only ever refuses more).
_MODULE_FILE = re.compile(r"([^.]+)(?:\..*)?\.(?:py|pyc|pyo|pyw|so|pyd)")
_IMPORT_ROOTS = ("src/", "")  # the more specific first
DIFF_LIMIT = 64 << 10  # bytes of unified diff kept for a person to read
# a planned run with this replica number or above reads the view with the admitted additions
# (its twin below it reads the pinned checks alone): both vote on the same verifier, so an
# addition that makes the pinned checks pass where they fail alone shows as disagreement
ADDITIONS_REPLICA = 1000
_SCHEMA = "choir.spec/v1"


def _regex(glob: str) -> str:
    body = glob.strip().strip("/")
    anchored = glob.strip().startswith("/") or "/" in body
    pattern = glob_regex(body) + ("/.*" if glob.strip().endswith("/") else "")
    return pattern if anchored else f"(?:.*/)?{pattern}"


def matcher(globs: Iterable[str]) -> Callable[[str], bool]:
    """A test for repo-relative posix paths against ``globs`` (.gitignore-like: a name
    without ``/`` matches at any depth, ``NAME/`` every file under such a folder, a ``/``
    anchors at the repo root)."""
    parts = [_regex(g) for g in globs if g.strip().strip("/")]
    if not parts:
        return lambda _path: False
    # any case: importlib.metadata reads ``X.DIST-INFO`` as ``x.dist-info``, and a file
    # system that folds case opens ``CONFTEST.PY`` for ``conftest.py``; and across line
    # breaks (``.`` stopped at one: a review's ``a\n/conftest.py`` matched no glob)
    compiled = re.compile("(?:" + "|".join(parts) + ")", re.IGNORECASE | re.DOTALL)
    return lambda path: compiled.fullmatch(path) is not None


def unnamable(rel: str) -> bool:
    """A path no check should have to reason about: a control character in it (a line
    break splits it for every tool that reads lines) or bytes that are not UTF-8 (no record
    can hold it as text). Never in a pin or a view; a tree that has one is refused."""
    if any(ch < " " or ch == "\x7f" for ch in rel):
        return True
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def shown_path(rel: str) -> str:
    """``rel`` as text any record can hold: bytes that are not UTF-8 as ``\\xNN``."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def entry_names(rel: str, st: os.stat_result | None) -> tuple[str, ...]:
    """What ``rel`` is matched as: itself, and a symlink also as the folder it may stand
    for (``x.dist-info -> meta/`` is a ``*.dist-info/`` folder to whoever follows it)."""
    return (rel, f"{rel}/_") if st is not None and stat.S_ISLNK(st.st_mode) else (rel,)


def compiled_file(rel: str) -> bool:
    """A compiled Python file (``*.pyc``, anything under ``__pycache__/``): never shown to a
    verifier in a view."""
    return rel.lower().endswith(_COMPILED) or "__pycache__" in rel.split("/")


def module_name(filename: str) -> str | None:
    """The module a file directly in an import root is found as (``json.pyc`` -> ``json``),
    or None for a file no import finds."""
    found = _MODULE_FILE.fullmatch(filename)
    return found.group(1) if found else None


def _found_as(rel: str) -> Iterator[tuple[str, str | None]]:
    """``src/x/...``, ``x.py`` or ``x.pyc`` -> the import root and module it would be found
    as, with the path below the module's folder (None for a module file); for each import
    root ``rel`` lies in, the more specific first."""
    for root in _IMPORT_ROOTS:
        if root and not rel.startswith(root):
            continue
        top, sep, rest = rel[len(root):].partition("/")
        name = top if sep else module_name(top)
        if name:
            yield root + name, rest if sep else None


def _is_init(inner: str | None) -> bool:
    """Whether the path below a module's folder is that folder's own ``__init__``."""
    return inner is not None and "/" not in inner and module_name(inner) == "__init__"


# a test module, or a conftest.py: pytest puts the folder of each first on the path too
_TEST_MODULE = re.compile(r"test_[^/]*\.py|[^/]*_test\.py|tests\.py|conftest\.py")
# what a pin from before ``Manifest.dirs`` took for a test module (it means what it meant)
_LEGACY_TEST_MODULE = re.compile(r"test_[^/]*\.py|[^/]*_test\.py")


def test_dirs(paths: Iterable[str], *, legacy: bool = False) -> frozenset[str]:
    """The folders holding test modules among ``paths``: pytest puts each first on the
    import path of its tests (its rootdir-based ``prepend`` import mode), a third import
    root beside the repo's and ``src/``."""
    pattern = _LEGACY_TEST_MODULE if legacy else _TEST_MODULE
    return frozenset(p.rpartition("/")[0] for p in paths
                     if pattern.fullmatch(p.rpartition("/")[2]))


def import_dirs(pinned: Iterable[str], paths: Iterable[str]) -> tuple[str, ...]:
    """The folders pytest puts first on the path of the ``pinned`` test modules (and
    ``conftest.py`` files) in its ``prepend`` mode, the repo's root left out (an import root
    already): a test's own folder when it holds no ``__init__``, else the first folder up
    that holds none (``qa/`` for ``qa/unit/test_x.py`` when ``qa/unit/__init__.py`` is in
    ``paths``, the base tree's: a review's new ``qa/calc.py`` stood in for the repo's
    ``calc``). A folder of a package is never one (``networkx/`` with its ``conftest.py``:
    a new ``networkx/types.py`` is only ever ``networkx.types``, which a later review found
    refused as if it were the standard ``types``)."""
    inits = {p.rpartition("/")[0] for p in paths if module_name(p.rpartition("/")[2]) ==
             "__init__"}
    found: set[str] = set()
    for folder in test_dirs(pinned):
        while folder and folder in inits:
            folder = folder.rpartition("/")[0]
        if folder:
            found.add(folder)
    return tuple(sorted(found))


# pytest's default ``--doctest-glob``: such a file is a check when it holds an example
_DOCTEST_FILE = re.compile(r"test[^/]*\.txt", re.IGNORECASE)


def doctest_name(rel: str) -> bool:
    """Whether pytest would collect ``rel`` as a doctest file if it holds an example."""
    return _DOCTEST_FILE.fullmatch(rel.rpartition("/")[2]) is not None


def _doctest(cursor: fsopen.DirCursor, rel: str, st: os.stat_result) -> bool:
    """Whether the snapshot's ``rel`` is a doctest file with an example (``>>>``): a check
    of the tree's (a review's new ``test_0.txt`` rebound ``add`` for the base's test), where
    a ``requirements/test.txt`` is none (pinning every ``test*.txt`` held a dependency
    bump, a later review found)."""
    if not doctest_name(rel):
        return False
    if stat.S_ISLNK(st.st_mode):
        return True  # pytest follows it to whatever it leads to: taken as one, unread
    if not stat.S_ISREG(st.st_mode):
        return False
    parts = fsopen.split(rel)
    fd, _st = fsopen.open_regular(parts[-1], cursor.dir(parts[:-1]))
    with os.fdopen(fd, "rb") as fh:  # read in pieces: a big data file is never held whole
        tail = b""
        while chunk := fh.read(1 << 16):
            if b">>>" in tail + chunk:
                return True
            tail = chunk[-2:]
    return False


def above_tests(pinned: Iterable[str]) -> frozenset[str]:
    """Every folder from a pinned test module's (or ``conftest.py``'s) up to the repo's root,
    the root included: pytest imports the ``__init__`` of each that is a package before the
    tests below it (a review's new root ``__init__.py`` ran before every test)."""
    found: set[str] = set()
    for folder in test_dirs(pinned):
        while folder not in found:
            found.add(folder)
            if not folder:
                break
            folder = folder.rpartition("/")[0]
    return frozenset(found)


def pinned_modules(pinned: Iterable[str]) -> frozenset[tuple[str, str]]:
    """(folder, module name) of each pinned file Python could import by name."""
    found = set()
    for path in pinned:
        folder, _, name = path.rpartition("/")
        module = module_name(name)
        if module:
            found.add((folder, module))
    return frozenset(found)


def stands_for_pinned(rel: str, modules: frozenset[tuple[str, str]]) -> bool:
    """Whether ``rel`` is found by the name of a pinned module in the same folder: Python's
    path finder takes a package (``test_calc/__init__.py``), an extension
    (``test_calc.abi3.so``) or an entry named ``test_calc`` (a link to a package) before the
    ``test_calc.py`` beside it (a review's package set ``__file__`` to the pinned file's and
    defined a passing test), so pytest imported the tree's module for the base's check."""
    folder, _, top = rel.rpartition("/")
    if (folder, top) in modules or (folder, module_name(top) or "") in modules:
        return True  # an extension, or an entry named as the module (a link to a package)
    if module_name(top) == "__init__" and folder:
        # a regular package: only its __init__ makes a folder win over a module beside it (a
        # folder without one, such as pytest-datadir's data folder of a test, never does)
        parent, _, name = folder.rpartition("/")
        return (parent, name) in modules
    return False


def _stands_in(rel: str, modules: frozenset[tuple[str, str]], above: frozenset[str]) -> bool:
    """Whether ``rel``, were it new, would be imported before or instead of the base's checks:
    found by a pinned module's name (``stands_for_pinned``), or the ``__init__`` of a folder
    at or above the tests (``above_tests``: pytest imports it before them)."""
    folder, _, top = rel.rpartition("/")
    return stands_for_pinned(rel, modules) or (module_name(top) == "__init__" and
                                               folder in above)


def _test_dir_module(rel: str,
                     folders: frozenset[str]) -> tuple[str, str, str | None] | None:
    """(test folder, module name, the path below the module's folder or None for a module
    file) when ``rel`` is a module file or in a package directly in one of ``folders``."""
    for folder in (rel.rpartition("/")[0], rel.rpartition("/")[0].rpartition("/")[0]):
        if folder and folder in folders:
            top, sep, rest = rel[len(folder) + 1:].partition("/")
            name = top if sep else module_name(top)
            return (folder, name, rest if sep else None) if name else None
    return None


def _importable(inner: str | None, linked: bool) -> bool:
    """Whether a path found under a module's name is what an import of that name can get:
    a module file (``inner`` None), a folder's ``__init__`` (a regular package) or a link
    standing for the folder. A file in a folder with no ``__init__`` is part of a namespace
    package, which never stands before a module of that name later on the path: a later
    review found ``html/index.html`` and ``locale/fr/...`` refused as if they were the
    standard modules."""
    return inner is None or _is_init(inner) or linked


def roots_of(paths: Iterable[str], pinned: Iterable[str] = ()) -> tuple[str, ...]:
    """The module names a tree of these file ``paths`` holds at its import roots (``calc``,
    ``src/pkg``), each folder that is a regular package also as ``NAME/`` (it holds an
    ``__init__``: a folder without one is a namespace portion, which never stands before a
    library's module of the same name, and a new ``__init__`` in it would); and those in the
    folders of the ``pinned`` test modules (``checks/helpers``)."""
    names = set()
    paths, pinned = list(paths), list(pinned)
    folders = frozenset(import_dirs(pinned, paths))
    for path in paths:
        if unnamable(path):
            continue  # never pinned, never seen: the tree that holds one is refused
        for name, inner in _found_as(path):
            names.add(name)
            if _is_init(inner):
                names.add(f"{name}/")
        if (found := _test_dir_module(path, folders)) is not None:
            names.add("/".join(found[:2]))
    return tuple(sorted(names))


def _test_packages(kinds: Mapping[str, str], folders: frozenset[str]) -> frozenset[str]:
    """The folders whose ``__init__`` is part of the tests: each of ``folders`` (holding a
    pinned test module), and each package above one whose code is all tests: no module of
    its own, and every subfolder holding code a folder of tests (``qa/`` of ``qa/unit/``:
    pytest imports ``qa`` first, and a later review hooked the reports in its
    ``__init__``); never a package of the code (``networkx/``, or ``mypkg/`` beside
    ``mypkg/core/``)."""
    inits: set[str] = set()
    coded: set[str] = set()
    below: set[str] = set()  # folders with code at or under them
    children: collections.defaultdict[str, set[str]] = collections.defaultdict(set)
    for path in kinds:
        folder, _, name = path.rpartition("/")
        module = module_name(name)
        if module == "__init__":
            inits.add(folder)
        elif module is not None:
            coded.add(folder)
            below.update(_ancestors(path))
        for above in _ancestors(path):
            children[above.rpartition("/")[0]].add(above)
    found = {f for f in folders if f}
    for folder in folders:
        while folder and folder in inits:
            folder = folder.rpartition("/")[0]
            if not folder or folder not in inits or folder in coded or any(
                    child in below and child not in found for child in children[folder]):
                break
            found.add(folder)
    return frozenset(found)


def pinned_paths(kinds: Mapping[str, str], globs: Sequence[str],
                 text: Callable[[str], str]) -> list[str]:
    """The paths of a tree (``kinds``: path -> ``f``, ``x`` or ``l``) to pin: those ``globs``
    match, the ``__init__`` of each folder of a pinned test module, each doctest file
    (``test*.txt`` with an example), and what each pinned
    symlink leads to inside the tree (its file, or every file
    under its folder), followed again: a review's base test was a link to a file no glob
    matched, which the tree then rewrote. ``text``: a path's text (a link's target, a
    file's content)."""
    is_spec = matcher(globs)
    chosen = {p for p in kinds if is_spec(p) and not unnamable(p)}
    # the __init__ of a folder holding a pinned test module or conftest.py: the package
    # pytest imports the tests as, before them (a review edited an empty one to hook the
    # reports; no glob named it)
    packages = _test_packages(kinds, test_dirs(chosen))
    chosen |= {p for p in kinds if module_name(p.rpartition("/")[2]) == "__init__" and
               p.rpartition("/")[0] in packages and not unnamable(p)}
    # the base's doctest files: checks pytest collects (``_doctest``)
    chosen |= {p for p in kinds if doctest_name(p) and not unnamable(p) and
               (kinds[p] == "l" or ">>>" in text(p))}
    todo = [p for p in chosen if kinds[p] == "l"]
    while todo:
        link = todo.pop()
        target = posixpath.normpath(posixpath.join(posixpath.dirname(link), text(link)))
        if target.startswith(("../", "/")) or target in ("..", "."):
            continue  # outside the tree: a snapshot refuses such a link anyway
        found = [target] if target in kinds else [p for p in kinds
                                                  if p.startswith(target + "/")]
        for path in found:
            if path not in chosen and not unnamable(path):
                chosen.add(path)
                if kinds[path] == "l":
                    todo.append(path)
    return sorted(chosen)


# Comments a linter, type checker, security scanner or coverage tool obeys in the code it
# checks: a new one changes what the check says as surely as an edit to its configuration
# (review 20a: a pull request failing the base's ruff added a file-wide ruff suppression and PASSed
# against ``--base``, the gate open). The base's are the project's; one a change adds is a
# change to the checks (``compare``).
SUPPRESSION = re.compile(
    rb"#\s*(?:noqa|nosec|type:\s*ignore|pragma:\s*no\s*(?:cover|branch)|"
    rb"(?:ruff|flake8)\s*:\s*noqa|mypy\s*:\s*ignore|pylint\s*:\s*disable|"
    rb"pyright\s*:\s*(?:ignore|basic)|isort\s*:\s*skip|fmt\s*:\s*(?:off|skip))",
    re.IGNORECASE)
_SOURCES = (".py", ".pyi", ".pyw")


def suppressions(data: bytes) -> tuple[str, ...]:
    """The lines of a source file that hold a suppression (``SUPPRESSION``), each as a short
    hash of its stripped text, sorted: moving one to another line, or adding one, shows."""
    if not SUPPRESSION.search(data):
        return ()
    return tuple(sorted(blake3_hex(line.strip())[:16] for line in data.splitlines()
                        if SUPPRESSION.search(line)))


def is_source(rel: str) -> bool:
    """A Python source file, whose suppressions are part of the checks."""
    return rel.lower().endswith(_SOURCES)


@dataclass(frozen=True)
class Manifest:
    """The pinned spec: its globs and ``{path: (kind, blake3)}`` (kind ``f``, ``x`` or ``l``);
    ``roots``: the module names the base tree's import roots held (see ``SHADOWED``)."""

    globs: tuple[str, ...]
    files: dict[str, tuple[str, str]]
    roots: tuple[str, ...] = ()
    # the folders pytest puts first for the tests (``import_dirs``: always written in a new
    # pin; None in one from before, which is judged by the rules it was made under), and the
    # base's own paths found by a pinned module's name (``stands_for_pinned``) or that are
    # the ``__init__`` of a folder above its tests (``above_tests``: written when any)
    dirs: tuple[str, ...] | None = None  # None: a manifest from before (``test_dirs``)
    overlaps: tuple[str, ...] = ()
    # the base's compiled files (``compiled_file``), ``(path, kind, blake3)``: never in a
    # view, so one new or changed is refused (``compare``); written when any
    compiled: tuple[tuple[str, str, str], ...] = ()
    # the base's source files that hold suppressions (``suppressions``), ``(path, lines)``;
    # None in a pin from before they were recorded (nothing is compared)
    suppressed: tuple[tuple[str, tuple[str, ...]], ...] | None = None

    @classmethod
    def of(cls, globs: Sequence[str], files: dict[str, tuple[str, str]],
           paths: Iterable[str],
           compiled: Mapping[str, tuple[str, str]] | None = None,
           suppressed: Mapping[str, tuple[str, ...]] | None = None) -> Manifest:
        """The pin of ``files`` (the spec files chosen) in a base tree of ``paths``, whose
        compiled files are ``compiled`` (``{path: (kind, blake3)}``) and whose source files
        hold the suppressions ``suppressed`` (``{path: suppressions(data)}``)."""
        paths = list(paths)
        modules, above = pinned_modules(files), above_tests(files)
        return cls(tuple(globs), files, roots_of(paths, files), import_dirs(files, paths),
                   tuple(sorted(p for p in paths if p not in files and not unnamable(p) and
                                _stands_in(p, modules, above))),
                   tuple(sorted((p, k, d) for p, (k, d) in (compiled or {}).items())),
                   tuple(sorted((p, v) for p, v in (suppressed or {}).items() if v)))

    @cached_property
    def suppressed_files(self) -> dict[str, tuple[str, ...]]:
        return dict(self.suppressed or ())

    @cached_property
    def compiled_files(self) -> dict[str, tuple[str, str]]:
        return {path: (kind, digest) for path, kind, digest in self.compiled}

    def encode(self) -> bytes:
        extra: dict[str, Any] = {} if self.dirs is None else {"dirs": list(self.dirs)}
        if self.overlaps:
            extra["overlaps"] = list(self.overlaps)
        if self.compiled:
            extra["compiled"] = {p: [k, d] for p, k, d in self.compiled}
        if self.suppressed is not None:
            extra["suppressed"] = {p: list(v) for p, v in self.suppressed}
        return canonical_json({"schema": _SCHEMA, "globs": list(self.globs),
                               "files": {p: list(v) for p, v in sorted(self.files.items())},
                               "roots": list(self.roots), **extra})

    @cached_property
    def is_spec(self) -> Callable[[str], bool]:
        return matcher(self.globs)

    @cached_property
    def _roots(self) -> frozenset[str]:
        return frozenset(self.roots)

    @property
    def legacy(self) -> bool:
        """A pin from before the rules that record ``dirs``: it is judged as it was."""
        return self.dirs is None

    @cached_property
    def _test_dirs(self) -> frozenset[str]:
        return test_dirs(self.files, legacy=True) if self.dirs is None else frozenset(self.dirs)

    @cached_property
    def _modules(self) -> frozenset[tuple[str, str]]:
        return pinned_modules(self.files)

    @cached_property
    def _overlaps(self) -> frozenset[str]:
        return frozenset(self.overlaps)

    @cached_property
    def _above(self) -> frozenset[str]:
        return above_tests(self.files)

    @cached_property
    def _root_modules(self) -> frozenset[str]:
        """The modules at the repo's import roots (``calc``; ``pkg`` of ``src/pkg``)."""
        return frozenset(r.removeprefix("src/") for r in self.roots
                         if not r.endswith("/") and r.removeprefix("src/").count("/") == 0)

    def spec_entry(self, rel: str, st: os.stat_result | None = None) -> bool:
        """``is_spec`` of the entry ``rel`` (a symlink also as a folder: ``entry_names``)."""
        return any(self.is_spec(name) for name in entry_names(rel, st))

    def shadows(self, rel: str, st: os.stat_result | None = None) -> bool:
        """True for a new file that would be imported instead of a library, the runner or a
        pinned module."""
        if not self.legacy and rel not in self.files and rel not in self._overlaps and \
                _stands_in(rel, self._modules, self._above):
            return True
        for path in entry_names(rel, st):
            for name, inner in itertools.islice(_found_as(path), 1):
                module = name.rpartition("/")[2]
                if not shadowed(module) or not _importable(inner, path != rel):
                    continue
                if name not in self._roots:
                    return True
                if _is_init(inner) and f"{name}/" not in self._roots:
                    return True  # a base folder made a regular package now
        for path in entry_names(rel, st):
            beside = _test_dir_module(path, self._test_dirs)
            if beside is None or "/".join(beside[:2]) in self._roots or \
                    not _importable(beside[2], path != rel):
                continue
            # first on the path of the tests beside it: a package of the folder itself, a
            # module the tests import from the repo, or a library's name
            name = beside[1]
            if name == "__init__" or name in self._root_modules or shadowed(name):
                return True
        return False

    def governs(self, rel: str, st: os.stat_result | None = None) -> bool:
        """True for a path the executor's version of never reaches a verifier unadmitted."""
        return unnamable(rel) or rel in self.files or self.spec_entry(rel, st) or \
            self.shadows(rel, st)


def load_manifest(store: ArtifactStore, digest: str) -> Manifest:
    """The manifest stored under ``digest``, its bytes checked against the digest.

    Raises:
        IntegrityError: missing, altered, or not a spec manifest.
    """
    import json

    data = store.read_bytes(digest)
    if blake3_hex(data) != digest:
        raise IntegrityError(f"spec manifest {digest[:12]} does not hash to its name")
    raw = json.loads(data)
    if not isinstance(raw, dict) or raw.get("schema") != _SCHEMA:
        raise IntegrityError(f"artifact {digest[:12]} is not a spec manifest")
    return Manifest(globs=tuple(raw["globs"]),
                    files={p: (v[0], v[1]) for p, v in raw["files"].items()},
                    roots=tuple(raw.get("roots", ())),
                    dirs=None if raw.get("dirs") is None else tuple(raw["dirs"]),
                    overlaps=tuple(raw.get("overlaps", ())),
                    compiled=tuple(sorted((p, v[0], v[1])
                                          for p, v in raw.get("compiled", {}).items())),
                    suppressed=None if raw.get("suppressed") is None else tuple(sorted(
                        (p, tuple(v)) for p, v in raw["suppressed"].items())))


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every file and symlink under ``root`` (relative posix path, lstat), in path order,
    walked by descriptor: no link is followed, whatever stands in the snapshot."""
    for entry in fsopen.walk(root):
        if stat.S_ISREG(entry.st.st_mode) or stat.S_ISLNK(entry.st.st_mode):
            yield entry.rel, entry.st


def _read(cursor: fsopen.DirCursor, rel: str,
          st: os.stat_result | None = None) -> tuple[str, bytes]:
    """(kind, bytes) of a file in a sealed snapshot: a symlink's target, never followed;
    opened from the snapshot's root one component at a time (``cursor`` keeps the folder
    chain open between sorted paths)."""
    parts = fsopen.split(rel)
    parent = cursor.dir(parts[:-1])
    st = st or os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        return "l", os.readlink(parts[-1], dir_fd=parent).encode("utf-8", "surrogateescape")
    fd, st = fsopen.open_regular(parts[-1], parent)
    with os.fdopen(fd, "rb") as fh:
        return ("x" if st.st_mode & 0o111 else "f"), fh.read()


def file_digests(tree: Path, rels: Iterable[str]) -> dict[str, str]:
    """``{path: blake3}`` of ``rels`` in the sealed snapshot ``tree``, as a manifest hashes
    them (a link's target; no link followed); a path that is gone is left out."""
    found: dict[str, str] = {}
    with fsopen.DirCursor(tree) as cursor:
        for rel in rels:
            try:
                found[rel] = blake3_hex(_read(cursor, rel)[1])
            except OSError:
                continue
    return found


def pinned_bytes(store: ArtifactStore, digest: str) -> bytes:
    """A pinned file's bytes from the store, checked against its digest."""
    data = store.read_bytes(digest)
    if blake3_hex(data) != digest:
        raise IntegrityError(f"pinned spec file {digest[:12]} does not hash to its name")
    return data


def pin_from_snapshot(tree: Path, globs: Sequence[str], store: ArtifactStore) -> str:
    """Store every spec file of the sealed snapshot ``tree`` and its manifest; returns the
    manifest's hash."""
    seen = dict(_walk(tree))
    kinds = {rel: "l" if stat.S_ISLNK(st.st_mode) else "f" for rel, st in seen.items()}
    files: dict[str, tuple[str, str]] = {}
    compiled: dict[str, tuple[str, str]] = {}
    with fsopen.DirCursor(tree) as cursor:
        chosen = pinned_paths(kinds, globs, lambda rel: _read(cursor, rel, seen[rel])[1]
                              .decode("utf-8", "surrogateescape"))
        for rel in chosen:
            kind, data = _read(cursor, rel, seen[rel])
            files[rel] = (kind, store.ingest_bytes(data))
        for rel in filter(compiled_file, seen):
            kind, data = _read(cursor, rel, seen[rel])
            compiled[rel] = (kind, blake3_hex(data))
        # a pinned file is compared whole (``compare``): only the others' are counted
        suppressed = {rel: suppressions(_read(cursor, rel, st)[1]) for rel, st in seen.items()
                      if is_source(rel) and rel not in files and stat.S_ISREG(st.st_mode)}
    return store.ingest_bytes(Manifest.of(globs, files, seen, compiled, suppressed).encode())


def pin_spec(repo: Path, globs: Sequence[str], root: Path,
             store: ArtifactStore | None = None) -> str:
    """Pin the spec of ``repo``'s tree as it is now (a run's base tree): the hashed files,
    copied once into a sealed snapshot in a private folder under ``root`` (dropped after, so
    a snapshot of the same tree another run is verifying is never touched), never the live
    folder."""
    private = root / f".pin-{os.getpid()}-{secrets.token_hex(6)}"
    try:
        snap = snapshot(repo, private)
        assert snap.path is not None
        return pin_from_snapshot(snap.path, globs, store or ArtifactStore())
    finally:
        remove_snapshot(private)


def compare(tree: Path, tree_hash: str, manifest: Manifest, may_change: Sequence[str],
            policy: SpecPolicy, store: ArtifactStore) -> SpecChange:
    """How the sealed snapshot ``tree`` differs from the pin, judged.

    Refused, in every mood: a change to a pinned file outside ``may_change`` and any new
    spec-matching file that is not an admitted addition. A change to a pinned file inside
    ``may_change``: refused, or held for a person (``policy``). So is a new regular file
    inside it that configures or hooks the test runner (``TEST_CONFIG``: a ``conftest.py``,
    ``pytest.ini``, ``pyproject.toml``): never an addition beside the pinned checks, run only
    once a person approved it (a review found "refused, approved or not" left a pull request
    that adds a test folder's ``conftest.py`` to be merged by hand). Refused in every mood: a
    new file that changes how the interpreter starts or where it looks (the rest of
    ``INFLUENCE``), a link named like test configuration, one that shadows a module, and one
    with no plain name. ``diff`` is the unified diff of every changed pinned file and every new
    file held, stored for the person and the record.
    """
    allowed, influence = matcher(may_change), matcher(INFLUENCE)
    harness = matcher([glob for glob in INFLUENCE if glob not in TEST_CONFIG])
    seen = dict(_walk(tree))
    # a new conftest.py puts its folder first on the tests' path, as a pinned one does: a
    # module beside it would stand in for the repo's once a person approved it (review 16g)
    manifest = _with_dirs_of(manifest, [rel for rel, st in seen.items()
                                        if rel not in manifest.files and
                                        stat.S_ISREG(st.st_mode) and allowed(rel)], seen)
    added: list[str] = []
    ignored: list[str] = []
    introduced: list[str] = []  # new, allowed, and changing how every check runs
    modified: list[str] = []
    suppressing: list[str] = []  # source files with a suppression the base did not have
    with fsopen.DirCursor(tree) as cursor:
        for rel, st in seen.items():
            if unnamable(rel):
                ignored.append(shown_path(rel))
            elif compiled_file(rel) and rel not in manifest.files:
                # never in a view, yet loaded in place of its source by whoever runs the
                # tree (an unchecked-hash .pyc): the checks did not see it (review 18b #1)
                kind, data = _read(cursor, rel, st)
                if manifest.compiled_files.get(rel) != (kind, blake3_hex(data)):
                    ignored.append(rel)
            elif rel in manifest.files:
                kind, data = _read(cursor, rel, st)
                if (kind, blake3_hex(data)) != manifest.files[rel]:
                    modified.append(rel)
            elif manifest.spec_entry(rel, st) or (not manifest.legacy and
                                                   _doctest(cursor, rel, st)):
                names = entry_names(rel, st)
                if not any(allowed(n) for n in names):
                    ignored.append(rel)
                elif any(influence(n) for n in names):
                    ignored.append(rel)  # unseen by the pinned checks until approved
                    if stat.S_ISREG(st.st_mode) and not any(harness(n) for n in names):
                        introduced.append(rel)  # a person can read it: held, not refused
                else:
                    added.append(rel)
            elif manifest.shadows(rel, st):
                ignored.append(rel)
            if manifest.suppressed is not None and rel not in manifest.files and \
                    is_source(rel) and stat.S_ISREG(st.st_mode) and \
                    _suppresses_more(manifest, rel, _read(cursor, rel, st)[1]):
                suppressing.append(rel)
    deleted = [p for p in manifest.files if p not in seen]
    declared = [*(p for p in (*modified, *deleted, *suppressing) if allowed(p)), *introduced]
    refused = [*(p for p in ignored if p not in introduced),
               *(p for p in (*modified, *deleted, *suppressing) if p not in declared)]
    held: list[str] = []
    (held if policy == "approve" else refused).extend(declared)
    shown = sorted([*modified, *deleted, *(introduced if policy == "approve" else ())])
    diff = _diff(tree, manifest, shown, store) if shown else None
    return SpecChange(tree_hash=tree_hash, added=tuple(sorted(added)), modified=tuple(modified),
                      deleted=tuple(sorted(deleted)), ignored=tuple(sorted(ignored)),
                      refused=tuple(sorted(refused)), held=tuple(sorted(held)), diff=diff)


def _suppresses_more(manifest: Manifest, rel: str, data: bytes) -> bool:
    """Whether ``data`` holds a suppression line the base's ``rel`` did not."""
    found = suppressions(data)
    if not found:
        return False
    return bool(collections.Counter(found) - collections.Counter(
        manifest.suppressed_files.get(rel, ())))


def _with_dirs_of(manifest: Manifest, new: Iterable[str], paths: Iterable[str]) -> Manifest:
    """``manifest`` with the folders pytest puts first for the new ``conftest.py`` files
    among ``new`` added to its ``dirs`` (``import_dirs``), judged in a tree of ``paths``."""
    configs = [rel for rel in new if rel.rpartition("/")[2].lower() == "conftest.py"]
    if manifest.legacy or not configs:
        return manifest
    assert manifest.dirs is not None
    return replace(manifest, dirs=tuple(sorted({*manifest.dirs,
                                                *import_dirs(configs, paths)})))


def _diff(tree: Path, manifest: Manifest, paths: list[str], store: ArtifactStore) -> str:
    """Store the unified diff (pinned -> executor's) of ``paths``; returns its hash."""
    out: list[str] = []
    for rel in paths:
        pinned = manifest.files.get(rel)  # None: a new file, held
        before = pinned_bytes(store, pinned[1]).decode("utf-8", "replace") if pinned else ""
        try:  # opened one component at a time: a folder the tree made a link is no file
            with fsopen.DirCursor(tree) as cursor:
                after = _read(cursor, rel)[1].decode("utf-8", "replace")
        except OSError as exc:
            if exc.errno not in _ABSENT:
                raise
            after = ""
        out.extend(difflib.unified_diff(_shown_lines(before), _shown_lines(after),
                                        f"a/{rel} (pinned)" if pinned else "/dev/null",
                                        f"b/{rel}"))
    text = "".join(out).encode()
    if len(text) > DIFF_LIMIT:  # the mark inside the limit: a reader of DIFF_LIMIT sees it
        mark = f"\n[choir] diff cut at {DIFF_LIMIT} bytes: read the files whole\n".encode()
        text = text[:DIFF_LIMIT - len(mark)] + mark
    return store.ingest_bytes(text)


# what ends a line of Python or moves a terminal's cursor, besides "\n": shown escaped in a
# diff a person approves from (review 16g: a lone carriage return hid a hook behind a
# comment on the line before it, which the terminal printed as one line)
_UNSEEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029"
                     "\u202a-\u202e\u2066-\u2069]")


def _shown_lines(text: str) -> list[str]:
    """``text`` split at line feeds only, every other control character written as an
    escape (``\\r``, ``\\x0c``, ``\\u2028``)."""
    lines = text.split("\n")
    kept = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    return [_UNSEEN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), line)
            for line in kept]


def repin(manifest: Manifest, tree: Path, paths: Sequence[str], store: ArtifactStore) -> str:
    """A new manifest with ``paths`` (changes a person approved) taken from ``tree``; the
    folders of the new ``conftest.py`` files among them are its tests' folders too."""
    manifest = _with_dirs_of(manifest, [p for p in paths if p not in manifest.files],
                             dict(_walk(tree)))
    files = dict(manifest.files)
    for rel in paths:
        try:  # one component at a time: a folder the tree made a link holds no file
            with fsopen.DirCursor(tree) as cursor:
                kind, data = _read(cursor, rel)
        except OSError as exc:
            if exc.errno not in _ABSENT:
                raise  # a read that failed is no deleted check
            files.pop(rel, None)
            continue
        files[rel] = (kind, store.ingest_bytes(data))
    return store.ingest_bytes(replace(manifest, files=files).encode())


def _write(path: Path, kind: str, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "l":
        os.symlink(data.decode("utf-8", "surrogateescape"), path)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o555 if kind == "x" else 0o444)


def _link(cursor: fsopen.DirCursor, rel: str, st: os.stat_result, dest: Path) -> None:
    """``rel`` of the sealed snapshot ``cursor`` walks, at ``dest / rel`` (its folder made
    already: ``_make_folders``): a hard link to a regular file (its inode sealed read-only),
    a symlink made again; a copy when no link can be made."""
    if stat.S_ISREG(st.st_mode):
        parts = fsopen.split(rel)
        try:
            os.link(parts[-1], dest / rel, src_dir_fd=cursor.dir(parts[:-1]),
                    follow_symlinks=False)
            return
        except OSError as exc:
            if exc.errno not in (errno.EMLINK, errno.EXDEV, errno.EPERM):
                raise
    _write(dest / rel, *_read(cursor, rel, st))


_DISK_THREADS = 16  # mkdirs and links at once: each waits on the disk, not the CPU


def _link_all(tree: Path, shown: Sequence[tuple[str, os.stat_result]], dest: Path) -> None:
    """``_link`` each of ``shown`` (sorted), in runs side by side: a link writes its inode's
    count, so each waits on the disk (0.1 ms; 0.75 s for Django's 6,810 files one by one).
    Each run walks its own slice with a cursor of its own."""
    size = max(256, -(-len(shown) // _DISK_THREADS))

    def run(start: int) -> None:
        with fsopen.DirCursor(tree) as cursor:
            for rel, st in shown[start:start + size]:
                _link(cursor, rel, st, dest)

    with ThreadPoolExecutor(_DISK_THREADS) as pool:
        list(pool.map(run, range(0, len(shown), size)))


def _make_folders(dest: Path, rels: Iterable[str]) -> None:
    """Every folder ``rels`` lie in, made under ``dest``, shallowest first, each depth side by
    side: a ``mkdir`` waits on the disk (half a millisecond on ext4 here; Django's 3,233
    folders took 1.1 s one by one, 0.14 s sixteen at a time)."""
    levels: dict[int, set[str]] = {}
    for rel in rels:
        parts = rel.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            levels.setdefault(depth, set()).add("/".join(parts[:depth]))
    with ThreadPoolExecutor(_DISK_THREADS) as pool:
        for depth in sorted(levels):
            list(pool.map(lambda rel: os.mkdir(dest / rel, 0o700), sorted(levels[depth])))


def view_key(tree_hash: str, manifest_hash: str, added: Sequence[str] = ()) -> str:
    """A view's folder name: its tree, its pin and the additions it admits."""
    return f"{tree_hash}.spec-" + blake3_hex(
        canonical_json([manifest_hash, list(added)]))[:24]


def build_view(tree: Path, tree_hash: str, manifest_hash: str, added: Sequence[str],
               root: Path, store: ArtifactStore,
               unchanged: Collection[str] = frozenset()) -> tuple[Path, str]:
    """What the verifiers read: the sealed snapshot ``tree`` with the spec reset to the pin
    and only the ``added`` files kept of the rest; sealed read-only under ``root``.
    Returns (path, tree hash of the view).

    The view is made privately and renamed into place (a folder that exists is complete);
    one already there is kept only if it hashes as the fresh one does. The tree's files are
    hard links to the sealed snapshot's (the same read-only inodes, nothing copied: a copy of
    a 7,000-file tree cost seconds on ext4), copies only where no link can be made (another
    file system, an inode linked the most times allowed); its symlinks are made again.
    ``unchanged``: pinned files ``compare`` found the tree holds as pinned (the same kind and
    bytes), linked from the tree like the rest; every other pinned file is written from the
    store, its bytes checked against the pin.
    """
    manifest = load_manifest(store, manifest_hash)
    final = root / view_key(tree_hash, manifest_hash, added)
    tmp = root / f".tmp-view-{os.getpid()}-{secrets.token_hex(6)}"
    tmp.mkdir(mode=0o700, parents=True)
    try:
        admitted, linked = set(added), set()
        shown: list[tuple[str, os.stat_result]] = []
        # where the pinned files go: a tree's file or link standing in for one of their
        # folders (`tests` made a file), or below one of them, is not shown (the pinned file
        # is written; `compare` found it deleted, which holds the tree)
        needed = {a for p in manifest.files for a in _ancestors(p)}
        with fsopen.DirCursor(tree) as cursor:
            for rel, st in _walk(tree):
                if compiled_file(rel):
                    continue  # compiled: never seen
                if rel in needed or any(a in manifest.files for a in _ancestors(rel)):
                    continue
                governed = manifest.governs(rel, st) or (
                    not manifest.legacy and rel not in manifest.files and
                    _doctest(cursor, rel, st))
                if governed and rel not in admitted:
                    if rel not in unchanged or rel not in manifest.files:
                        continue  # pinned (written below) or not admitted: never seen
                    linked.add(rel)
                shown.append((rel, st))
        _make_folders(tmp, [rel for rel, _st in shown] + list(manifest.files))
        _link_all(tree, shown, tmp)
        for rel, (kind, digest) in manifest.files.items():
            if rel not in linked and not compiled_file(rel):
                _write(tmp / rel, kind, pinned_bytes(store, digest))
        for dirpath, _dirs, _names in os.walk(tmp, topdown=False):
            os.chmod(dirpath, 0o555)
        fresh = inspect_tree(tmp).tree_hash
        if final.is_dir() and inspect_tree(final).tree_hash == fresh:
            remove_snapshot(tmp)
            return final, fresh
        remove_snapshot(final)
        os.rename(tmp, final)
    except BaseException:
        remove_snapshot(tmp)
        raise
    return final, fresh


# what opening a path of a snapshot one component at a time says when nothing is there: no
# entry, a file or a link where a folder was, a link where a file was
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EINVAL)


def _ancestors(rel: str) -> Iterator[str]:
    """The folders above ``rel`` (``a/b/c`` -> ``a/b``, ``a``)."""
    folder = rel.rpartition("/")[0]
    while folder:
        yield folder
        folder = folder.rpartition("/")[0]


def _unchanged(store: ArtifactStore, manifest_hash: str, change: SpecChange) -> frozenset[str]:
    """The pinned files ``change`` found as pinned in its tree: neither modified nor deleted
    (an approved change's held files were repinned from the tree, but are left out)."""
    files = load_manifest(store, manifest_hash).files
    return frozenset(files) - set(change.modified) - set(change.deleted)


def ensure_view(tree: Path, manifest_hash: str, change: SpecChange, root: Path,
                store: ArtifactStore, *, additions: bool = False) -> Path:
    """The view ``change`` names: with the pinned checks alone (``view_hash``), or with the
    admitted additions beside them (``additions_view``). The existing folder when it still
    hashes to that, else a fresh one built from ``tree``.

    Raises:
        IntegrityError: the fresh view hashes differently (the snapshot or the pin moved).
    """
    added = change.added if additions else ()
    expected = change.additions_view if additions else change.view_hash
    existing = root / view_key(change.tree_hash, manifest_hash, added)
    if existing.is_dir() and inspect_tree(existing).tree_hash == expected:
        return existing
    path, fresh = build_view(tree, change.tree_hash, manifest_hash, added, root, store,
                             _unchanged(store, manifest_hash, change))
    if fresh != expected:
        raise IntegrityError(f"the spec view of {change.tree_hash[:12]} hashes to "
                             f"{fresh[:12]}, not {expected[:12]}; nothing verified")
    return path


def _views(tree: Path, manifest_hash: str, change: SpecChange, root: Path,
           store: ArtifactStore) -> SpecChange:
    """``change`` with its views built: the pinned checks alone, and (with additions) the
    pinned checks beside the admitted additions."""
    same = _unchanged(store, manifest_hash, change)
    _path, alone = build_view(tree, change.tree_hash, manifest_hash, (), root, store, same)
    extended = ""
    if change.added:
        _path, extended = build_view(tree, change.tree_hash, manifest_hash, change.added,
                                     root, store, same)
    return change.model_copy(update={"view_hash": alone, "additions_view": extended})


def refusal_summary(change: SpecChange, limit: int = 400) -> str:
    """One bounded line for a report, a reason or an event."""
    held = set(change.held)
    listed = {*change.modified, *change.deleted, *change.ignored}
    parts = [f"{name} {', '.join(paths)}" for name, paths in
             (("modified", change.modified), ("deleted", change.deleted),
              ("a new lint or coverage suppression in",
               sorted(p for p in {*change.refused, *change.held} if p not in listed)),
              ("new test configuration", [p for p in change.ignored if p in held]),
              ("added outside may_change_spec", [p for p in change.ignored if p not in held]),
              ("admitted", change.added)) if paths]
    text = "; ".join(parts) or "no change"
    return text if len(text) <= limit else text[:limit - 3] + "..."



def judge_round(tree: Path, tree_hash: str, manifest_hash: str, may_change: Sequence[str],
                policy: SpecPolicy, root: Path, store: ArtifactStore | None = None) -> SpecChange:
    """Compare the sealed snapshot ``tree`` with the pin and build the view its verifiers
    will read; the change records the view's hash."""
    store = store or ArtifactStore()
    change = compare(tree, tree_hash, load_manifest(store, manifest_hash), may_change, policy,
                     store)
    return _views(tree, manifest_hash, change, root, store)


def approve_change(tree: Path, manifest_hash: str, change: SpecChange, root: Path,
                   store: ArtifactStore | None = None) -> tuple[str, SpecChange]:
    """A person approved ``change.held``: the new pin (those files as the executor left
    them) and the change as recorded from now on (approved, its view rebuilt on the new pin).
    """
    store = store or ArtifactStore()
    pin = repin(load_manifest(store, manifest_hash), tree, change.held, store)
    return pin, _views(tree, pin, change.model_copy(update={"approved": True}), root, store)


def remove_views(root: Path, tree_hash: str) -> None:
    """Drop every spec view of ``tree_hash`` under ``root``."""
    for path in root.glob(f"{tree_hash}.spec-*"):
        remove_snapshot(path)
