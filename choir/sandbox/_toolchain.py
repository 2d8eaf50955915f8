"""Which host folders a sandboxed step may see besides /usr and /etc: exactly the project's
interpreter, and nothing that holds a secret.

Binding the parent of every PATH entry ending in ``/bin`` bound ``$HOME`` whole whenever
``~/bin`` was on PATH, and a step printed the signing key. Now a step sees the
chosen interpreter's installation and its venv, resolved exactly, plus the ``binds`` that
``choir.yaml`` names; PATH entries are never bound. The interpreter is, in this order:
``sandbox.python`` in ``choir.yaml`` (an interpreter or a venv folder), the active venv
(``VIRTUAL_ENV``, unless it is Choir's own), the repo's ``.venv``, else the base
installation Choir's own Python came from; never Choir's own venv, whose packages (pytest
plugins) would leak into the project's test run. A venv is read from its
``pyvenv.cfg``, never by running its interpreter on the host: the repo's ``.venv`` is the
project's code.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from choir._core.paths import artifact_dir, choir_home
from choir.exceptions import ConfigError

SYSTEM = ("/usr", "/etc", "/bin", "/lib", "/lib64", "/sbin")
FORBIDDEN = ("/proc", "/sys", "/dev", "/run", "/var/run", "/boot")
PYVENV_MAX = 64 << 10  # a pyvenv.cfg is a few lines
# every user's and process's scratch: the host's Unix sockets (tmux, X11, agents, other
# steps' egress proxies) live there, and a socket connects through a read-only bind
SHARED_ROOTS = ("/tmp", "/var/tmp")
# more folders of host sockets; a bind inside them is refused as FORBIDDEN already, a
# bind holding them (/var, for a /var/run that is no link) by ``holds_shared_root``
SOCKET_ROOTS = ("/run", "/var/run")


@dataclass(frozen=True)
class Toolchain:
    """Read-only binds (host path = sandbox path) and the PATH head that finds them."""

    binds: tuple[str, ...]
    path_head: tuple[str, ...]
    venv: str | None


def _protected() -> list[tuple[Path, bool]]:
    """Folders no bind may contain: the key and AHDB home, the artifact store, $HOME; with
    whether a bind inside one is refused too (Choir's own stores: yes; $HOME, where repos and
    interpreters live: no)."""
    found = []
    for path, whole in ((choir_home(), True), (artifact_dir(), True), (Path.home(), False)):
        try:
            found.append((Path(os.path.realpath(path)), whole))
        except OSError:
            continue
    return found


# where a sandbox's binds come from: choir.yaml's sandbox.binds and its resources' folders
# (a SQLite resource's folder an action removed reads as one of them, review 17a)
BINDS_ORIGIN = "choir.yaml sandbox.binds (or a resource's folder)"


def check_bind(path: str, *, origin: str, sealed: Sequence[Path] = (),
               pinned: bool = False) -> str:
    """``path`` resolved, or ConfigError when binding it would expose a secret or the host.

    A folder inside Choir's home or artifact store is refused as well as one containing
    them: a bind's path can be a link an executor planted in the repo (a resource folder
    swapped for a link to ``$CHOIR_HOME/heldout``), and Docker's engine binds host paths
    outside the mount namespace that masks the key. ``sealed`` adds folders guarded the same
    way (the held-out checks named outside the home).

    ``pinned``: ``path`` is the real path the configuration resolved when it was read (a
    sandbox opening later, after an executor ran): one that leads elsewhere now is refused,
    never resolved again.

    Raises:
        ConfigError: the path is relative, missing, a system pseudo-filesystem, is or
            holds a shared temp root (``holds_shared_root``), contains CHOIR_HOME, the
            artifact store or $HOME, or lies inside Choir's stores; or,
            ``pinned``, it leads elsewhere than when it was read.
    """
    if not os.path.isabs(path):
        raise ConfigError(f"{origin}: bind '{path}' is relative; give an absolute path")
    real = os.path.realpath(path)
    if pinned and real != os.path.normpath(path):
        raise ConfigError(f"{origin}: bind '{path}' now leads to {real}: it changed since "
                          "choir.yaml was read (a link planted in its place?), and is not "
                          "bound")
    if not os.path.exists(real):
        raise ConfigError(f"{origin}: bind '{path}' does not exist")
    here = Path(real)
    if real == "/" or any(real == f or real.startswith(f + "/") for f in FORBIDDEN):
        raise ConfigError(f"{origin}: bind '{path}' exposes the host ({real}); bind a "
                          "narrower folder")
    shared = holds_shared_root(real)
    why = ("the host's shared temp folder: its Unix sockets (tmux, X11, agents, other "
           "steps' egress proxies) would connect from the sandbox")
    if shared == real:
        raise ConfigError(f"{origin}: bind '{path}' is {why}; bind the folder of your own "
                          "the step needs")
    for secret, whole in [*_protected(), *((Path(p), True) for p in sealed)]:
        if secret == here or here in secret.parents:
            raise ConfigError(
                f"{origin}: bind '{path}' contains {secret} (CHOIR_HOME, the artifact store or "
                "$HOME): the signing key would be readable; bind the exact folder the step "
                "needs instead")
        if whole and secret in here.parents:
            raise ConfigError(
                f"{origin}: bind '{path}' leads into {secret} ({real}), a store of Choir's "
                "(CHOIR_HOME, the artifact store, the held-out checks) that no step may read; "
                "if the path is a link, replace it with the folder itself")
    if shared is not None:  # after Choir's stores: a folder holding the key says so first
        raise ConfigError(f"{origin}: bind '{path}' ({real}) holds {shared}, {why}; bind "
                          f"the folder the step needs inside it, beside {shared}")
    return real


def holds_shared_root(path: str, *, own_temp: bool = True) -> str | None:
    """The shared temp root (``SHARED_ROOTS``, ``SOCKET_ROOTS`` and, with ``own_temp``,
    Choir's temp folder, where egress sockets fall back) that ``path`` is or contains,
    compared as real paths; else None.

    Not only the root itself: ``/var`` holds ``/var/tmp``, and a bind of it let a
    network-off step connect to every host socket there (review 23b).
    """
    real = os.path.realpath(path)
    inside = real.rstrip("/") + "/"  # "/" holds everything
    roots: list[str] = [*SHARED_ROOTS, *SOCKET_ROOTS]
    if own_temp:
        roots.append(tempfile.gettempdir())
    for root in roots:
        for form in (os.path.normpath(root), os.path.realpath(root)):
            if form == real or form.startswith(inside):
                return form
    return None


def _venv_base(venv: Path) -> str | None:
    """The base installation of a venv, from its ``pyvenv.cfg`` ``home = .../bin``."""
    try:
        # a few lines; one that is not a regular file, or past 64 KiB, is no venv's (a link
        # an executor planted to a huge file was read whole into Choir's memory; a FIFO
        # blocks a plain open)
        fd = os.open(venv / "pyvenv.cfg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = fh.read(PYVENV_MAX + 1)
    except OSError:
        return None
    if len(data) > PYVENV_MAX:
        return None
    lines = data.decode("utf-8", "replace").splitlines()
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            home = os.path.realpath(value.strip())
            base = os.path.dirname(home) if home.endswith("/bin") else home
            # a repo's pyvenv.cfg is the repo's to write: its home is bound into the step's
            # sandbox only when it is a Python installation (review 16f: `home =
            # ~/.ssh/bin` bound ~/.ssh, and the step read the key), never any folder named
            return base if _installation(base) else None
    return None


def _installation(base: str) -> bool:
    """Whether ``base`` holds a Python installation: an executable ``bin/python*`` or
    ``bin/pypy*`` (``make altinstall`` makes only ``python3.X``), and a ``lib/python3*`` or
    ``lib/pypy3*`` folder beside it."""
    try:
        bindir = os.path.join(base, "bin")
        runs = any(name.startswith(("python", "pypy")) and
                   os.path.isfile(os.path.join(bindir, name)) and
                   os.access(os.path.join(bindir, name), os.X_OK)
                   for name in os.listdir(bindir))
        libs = any(name.startswith(("python3", "pypy3"))
                   for name in os.listdir(os.path.join(base, "lib")))
    except OSError:
        return False
    return runs and libs


def _from_interpreter(python: str) -> tuple[str | None, str]:
    """(venv, base prefix) of an interpreter path or a venv folder."""
    given = Path(python)
    if given.is_dir():
        venv: Path | None = given
    elif (given.parent.parent / "pyvenv.cfg").is_file():
        venv = given.parent.parent
    else:
        venv = None
    if venv is not None:
        base = _venv_base(venv)
        if base is None:
            raise ConfigError(f"{python} is not a venv Choir uses: no readable pyvenv.cfg "
                              "whose 'home =' is a Python installation (bin/python*, "
                              "lib/python3*)")
        return str(venv.absolute()), base
    real = os.path.realpath(python)
    if not os.path.isfile(real):
        raise ConfigError(f"sandbox.python: {python} does not exist")
    return None, os.path.dirname(os.path.dirname(real))


def active_venv() -> bool:
    """True when VIRTUAL_ENV names a venv that is not Choir's own (an activated Choir venv
    is where Choir's plugins come from, not the project's environment)."""
    active = os.environ.get("VIRTUAL_ENV")
    if not active or not (Path(active) / "pyvenv.cfg").is_file():
        return False
    return os.path.realpath(active) != os.path.realpath(sys.prefix)


def choose(repo: Path, python: str | None = None,
           extra_binds: tuple[str, ...] = ()) -> Toolchain:
    """The toolchain a step in ``repo`` runs with (module docstring gives the order).

    Raises:
        ConfigError: a configured interpreter or bind is unusable or would expose a secret.
    """
    if python:
        venv, base = _from_interpreter(python)
    elif active_venv():
        venv, base = _from_interpreter(os.environ["VIRTUAL_ENV"])
    elif (repo / ".venv" / "pyvenv.cfg").is_file():
        venv, base = _from_interpreter(str(repo / ".venv"))
    else:
        venv, base = None, sys.base_prefix
    binds: list[str] = []
    head: list[str] = []
    for path, origin in ((venv, "the project's venv"), (base, "the project's Python")):
        if not path:
            continue
        head.append(f"{path}/bin")
        real = os.path.realpath(path)
        if real == "/usr" or real.startswith(SYSTEM):
            continue
        binds.append(check_bind(path, origin=origin))
    for bind in extra_binds:
        binds.append(check_bind(bind, origin=BINDS_ORIGIN, pinned=True))
    kept: list[str] = []
    for path in sorted(set(binds)):
        if not any(path.startswith(k + "/") for k in kept):
            kept.append(path)
    return Toolchain(binds=tuple(kept), path_head=tuple(dict.fromkeys(head)), venv=venv)
