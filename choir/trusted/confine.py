"""Hide the key folder from this process once the broker holds the key.

Called at the entry of a ``choir`` command, after the broker is forked and before the
command reads any repo, snapshot, log or ``$CHOIR_OUT``. What it can do depends on who runs
Choir; it returns the level reached, and each level holds only what it says:

``mount-namespace`` (root): the process enters a private mount namespace (mounts made
    private, so nothing propagates back to the host), an empty read-only tmpfs is mounted
    over ``$CHOIR_HOME/keys``, and ``CAP_SYS_PTRACE`` is dropped from the effective,
    permitted, inheritable and bounding sets. The key path, any link that resolves to it
    and ``/proc/<broker>/{root,mem,environ,fd}`` (the broker is non-dumpable) all give
    nothing, here and in every child (git, sandboxes, a host executor).
``user-namespace`` (not root): the same mask inside a new user and mount namespace that
    maps only the caller's own uid and gid. The broker stays in the parent user namespace,
    so the capabilities this process holds in its own namespace give no ptrace over it.
``process`` (the namespaces were refused, or threads already run): the key is not in this
    process's memory, but its file stays reachable by path; the caller is told.

At every level, ``process`` included, the process then makes itself non-dumpable
(``non_dumpable``): a step it starts without a sandbox (``--sandbox local``,
``executor_isolation: none``) runs as the same user, and could otherwise copy the broker's
socket out of it (``pidfd_getfd``), read its ``/proc/<pid>/environ`` or ptrace it, then have
the broker sign what it likes (review 23a, F1). ``execve`` makes a process dumpable again,
so the steps themselves are unaffected; a fork (``choir serve``'s workers) stays
non-dumpable.

What no level stops: code running as root in this process (a compromised plugin, not a
tree-handling bug) still holds ``CAP_SYS_ADMIN`` and can unmount the mask. Running the
broker under its own uid would close that; ``docs/security.md`` says so.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from choir._core import mounts, standing

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REC, MS_PRIVATE = 1 << 14, 1 << 18
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
PR_CAPBSET_DROP = 24
CAP_SYS_PTRACE = 19
PR_SET_DUMPABLE = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_confined: dict[str, str] = {}
_why: dict[str, str] = {}  # why a folder's confinement stopped at ``process``
_origin: list[int] = []  # a descriptor of the mount namespace this process started in
_standing: list[tuple[str, str, str]] = []  # its standing then (``origin_standing``)


def origin_fd() -> int | None:
    """A descriptor of the mount namespace this process was in before ``confine`` made it
    one of its own (None when it never did): the one where its paths mean what the user's
    do. ``choir serve`` compares a client's with its own; ``choir mcp``, confined, sends it."""
    return _origin[0] if _origin else None


def origin_namespace() -> tuple[int, int]:
    """The identity (device, inode) of that namespace, or of the current one."""
    fd = origin_fd()
    found = os.fstat(fd) if fd is not None else os.stat("/proc/self/ns/mnt")
    return found.st_dev, found.st_ino


def origin_standing() -> tuple[str, str, str] | None:
    """What this process's standing was before ``confine`` changed it (None when it never
    did): ``choir._core.standing.snapshot``'s. A namespace of its own holds every
    capability, and another group list, so ``choir serve`` compares a client with what the
    service stood on as a cold command does before it confines itself
    (``choir.serve.stale.standing``)."""
    return _standing[0] if _standing else None


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mask(libc: ctypes.CDLL, keys: Path) -> None:
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    _check(libc.mount(b"choir-keys-mask", os.fsencode(keys), b"tmpfs",
                      MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k,mode=0500"),
           f"mask {keys}")


def _drop_ptrace(libc: ctypes.CDLL) -> None:
    _check(libc.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0), "drop CAP_SYS_PTRACE")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.capget(ctypes.byref(header), data), "capget")
    for half in data:
        for name in ("effective", "permitted", "inheritable"):
            setattr(half, name, getattr(half, name) & ~(1 << CAP_SYS_PTRACE))
    _check(libc.capset(ctypes.byref(header), data), "capset")


def non_dumpable() -> None:
    """Make this process non-dumpable: another process of the same user (a step, a test
    this process runs) can then neither ptrace it, nor read its ``/proc/<pid>/{mem,environ,
    fd}``, nor copy a descriptor out of it with ``pidfd_getfd``; only ``CAP_SYS_PTRACE``
    over it can. The broker and every confined process call it (``confine``)."""
    _check(_libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "make the process non-dumpable")


def _map_self() -> None:
    uid, gid = os.getuid(), os.getgid()
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)


def _single_threaded() -> bool:
    return len(os.listdir("/proc/self/task")) == 1


def keys_dir(home: Path) -> Path:
    """``home/keys``, created owner-only (the confinement masks exactly this folder)."""
    keys = home / "keys"
    keys.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(keys, 0o700)
    return keys


def confine(keys: Path) -> str:
    """Hide ``keys`` from this process and its children; returns the level reached."""
    where = str(keys.absolute())
    if where in _confined:
        return _confined[where]
    level, why = "process", "other threads already run in this process"
    if not _origin:
        _origin.append(os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC))
        _standing.append(standing.snapshot())
    if _single_threaded():
        libc = _libc()
        try:
            if os.geteuid() == 0:
                _check(libc.unshare(CLONE_NEWNS), "unshare the mount namespace")
                _mask(libc, keys)
                _drop_ptrace(libc)
                level = "mount-namespace"
            else:
                _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare user and mounts")
                _map_self()
                _mask(libc, keys)
                level = "user-namespace"
        except OSError as exc:
            level, why = "process", str(exc)
    if level != "process":
        mounts.mark_private()  # every mount private: one made now dies with this process
    non_dumpable()  # last: a non-dumpable process's /proc/self files are root's (_map_self)
    _confined[where] = level
    if level == "process":
        _why[where] = why
    return level


def confinement(keys: Path) -> str | None:
    """The level ``confine`` reached for ``keys`` in this process, or None if not called."""
    return _confined.get(str(keys.absolute()))


def why_process(keys: Path) -> str:
    """Why ``confine`` stopped at ``process`` for ``keys`` (the call that was refused), or
    ''."""
    return _why.get(str(keys.absolute()), "")
