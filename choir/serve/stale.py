"""Whether a running service answers exactly as this process would, cold.

The service imported Choir once, at its start; a request is answered by that code in that
interpreter. So it may answer only a client that would have run the same: the same version,
the same files of the ``choir`` package and its packaged policies and prompts (path, size and
modification time of each, the way ``make`` and git's index tell a changed file), the same
interpreter, the same installed packages (the plugins that entry points find: the folders on
``sys.path`` and their modification times, which an install changes), and the same variables
that act before any code runs (``PYTHON*``, ``LD_*``, the locale's). Anything else in the
environment is the request's own: the worker runs with the client's environment, never the
service's. A client that differs in any of these is told the service is stale and runs cold.

Standard library only (no ``pathlib``), and cheap (a few hundred ``stat`` calls): the client
computes it on every ``choir verify``.
"""

from __future__ import annotations

import importlib
import os
import sys

from choir._version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def _sha256() -> Any:
    """A SHA-256 object. CPython's own implementation where there is one: importing hashlib
    loads OpenSSL, 3-20 ms measured on the warm path of every ``choir verify``."""
    for name in ("_sha256", "_sha2"):  # Python 3.12 renamed the module
        try:
            return importlib.import_module(name).sha256()
        except ImportError:
            continue
    import hashlib  # pragma: no cover - an interpreter without them

    return hashlib.sha256()  # pragma: no cover

START_PREFIXES = ("PYTHON", "LD_", "LANGSMITH_", "LANGCHAIN_")
START_NAMES = ("LANG", "LC_ALL", "LC_CTYPE")
"""Variables read by the interpreter or the dynamic loader before Choir runs (the locale
ones choose the encoding of the standard streams and of file names), and those a library
reads once and keeps while the service warms up (LangSmith's tracing switch: a worker
would trace, or not, as the service's environment said)."""


def _package_files(root: str) -> list[str]:
    rows: list[str] = []
    skip = len(root) + 1  # a path's part after the root (``relpath`` was 60% of this)
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = f"{dirpath}/{name}"
            try:
                info = os.stat(path)
            except OSError:
                continue
            rows.append(f"{path[skip:]}\0{info.st_size}\0{info.st_mtime_ns}")
    return rows


def _data_roots(package: str) -> list[str]:
    """Where the packaged policies and prompts are (``choir._core.resources``)."""
    if os.path.isdir(os.path.join(package, "_data")):
        return []  # inside the package: already walked
    return [os.path.join(os.path.dirname(package), name) for name in ("policies", "prompts")]


def code() -> str:
    """A digest of the code a request would run: package, data, interpreter, installs."""
    import choir

    package = os.path.dirname(os.path.realpath(choir.__file__))
    digest = _sha256()
    for part in (__version__, package, os.path.realpath(sys.executable), sys.version,
                 sys.prefix, *_package_files(package)):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\n")
    for root in _data_roots(package):
        digest.update(f"data {root}\n".encode())
        for row in _package_files(root):
            digest.update(row.encode("utf-8", "surrogateescape") + b"\n")
    # the first is the script's folder or the current one, except under -P (the service)
    for entry in sys.path if sys.flags.safe_path else sys.path[1:]:
        try:
            mtime = os.stat(entry or ".").st_mtime_ns
        except OSError:
            mtime = -1
        digest.update(f"path {entry}\0{mtime}\n".encode("utf-8", "surrogateescape"))
    return str(digest.hexdigest())


def start_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that act before any code runs."""
    return {k: v for k, v in environ.items()
            if k.startswith(START_PREFIXES) or k in START_NAMES}


def differences(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The names whose values differ between two start-up environments, sorted."""
    return sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))


__all__ = ["START_NAMES", "START_PREFIXES", "code", "differences", "start_env"]
