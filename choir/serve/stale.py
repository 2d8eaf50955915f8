"""Whether a running service answers exactly as this process would, cold.

The service imported Choir once, at its start; a request is answered by that code in that
interpreter. So it may answer only a client that would have run the same: the same version,
the same files of the ``choir`` package and its packaged policies and prompts (path, size and
modification time of each, the way ``make`` and git's index tell a changed file), the same
interpreter, the same installed packages (the plugins that entry points find: the folders on
``sys.path`` and their modification times, which an install changes), and the same variables
that act before any code runs (``PYTHON*``, ``LD_*``, the locale's), and the same process
standing: capabilities, ``no_new_privs``, seccomp, LSM label and groups (``standing``;
not the cgroup: under systemd each terminal is a scope of its own, and a service would be
stale for every other one, while the limits that matter reach the steps as the client's
resource limits and Choir's own cgroups). A worker is forked from the service, so it
holds what the service held: a service that could make namespaces served a client that
could not, and ``--sandbox auto`` chose differently for it than the client's cold command
did. Anything else in the
environment is the request's own: the worker runs with the client's environment, never the
service's, and takes its resource limits (``rlimits``). A client that differs in any of
these is told the service is stale and runs cold.

Standard library only (no ``pathlib``), and cheap (a few hundred ``stat`` calls): the client
computes it on every ``choir verify``.
"""

from __future__ import annotations

import importlib
import os
import sys

from choir._core.standing import snapshot
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


STATUS_FIELDS = ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")
RLIMITS = ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE",
           "RLIMIT_MEMLOCK", "RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_NOFILE", "RLIMIT_NPROC",
           "RLIMIT_RSS", "RLIMIT_RTPRIO", "RLIMIT_RTTIME", "RLIMIT_SIGPENDING", "RLIMIT_STACK")


def standing() -> dict[str, str]:
    """What this process may do beyond its uid, as a cold command would start with it:
    ``STATUS_FIELDS`` of ``/proc/self/status``, its LSM label (``lsm``) and its gids
    (``groups``). Two files read, no ``re``: the client asks on every ``choir verify``.

    A process that confined itself (the service; a ``choir mcp`` asking it) gives what it
    stood on before (``choir.trusted.confine.origin_standing``): its own namespace holds
    every capability and another group list. That module is looked up, not imported: a
    process that never loaded it never confined itself.
    """
    confine = sys.modules.get("choir.trusted.confine")
    before = confine.origin_standing() if confine is not None else None
    if before is None:
        before = snapshot()
    status, label, groups = before
    found = dict.fromkeys(STATUS_FIELDS, "")
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in found:
            found[name] = value.strip()
    return {**found, "lsm": label.strip("\0\n "), "groups": groups}


def rlimits() -> dict[str, tuple[int, int]]:
    """This process's resource limits (soft, hard; -1 unlimited), by ``RLIMITS`` name."""
    import resource  # a small C module (0.4 ms measured), loaded only here

    return {name: resource.getrlimit(getattr(resource, name)) for name in RLIMITS
            if hasattr(resource, name)}


def start_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that act before any code runs."""
    return {k: v for k, v in environ.items()
            if k.startswith(START_PREFIXES) or k in START_NAMES}


def differences(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The names whose values differ between two start-up environments, sorted."""
    return sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))


__all__ = ["RLIMITS", "START_NAMES", "START_PREFIXES", "STATUS_FIELDS", "code", "differences",
           "rlimits", "standing", "start_env"]
