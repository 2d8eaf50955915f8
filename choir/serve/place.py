"""Where the service listens: an owner-only folder in ``CHOIR_HOME``, checked by descriptor.

``$CHOIR_HOME/serve/`` holds ``sock`` (the listening socket, 0600), ``lock`` (``flock``ed by
the running service, holding its pid) and ``log`` (what ``choir serve --detach`` prints).
Both ends trust the folder only once they hold a descriptor of it that is a real folder (not
a link: ``O_NOFOLLOW``), owned by their own uid and closed to everyone else; everything in it
is then reached from that descriptor (``dir_fd``, or ``/proc/self/fd/N/sock`` for the
socket, which also keeps a long home under the 108-byte limit of a socket address). Another
user who pre-creates the folder, swaps it for a link or opens it up is refused by both, and
a folder renamed away after the check changes nothing: the descriptor still names the
checked one. Standard library only, and no ``pathlib``: the client imports it on every
``choir verify``.
"""

from __future__ import annotations

import os
import stat

from choir._core.errors import UserError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from os import PathLike
    from pathlib import Path

FOLDER = "serve"
SOCKET = "sock"
LOCK = "lock"
LOG = "log"


def folder(home: str | PathLike[str]) -> Path:
    from pathlib import Path

    return Path(home, FOLDER)


def open_folder(home: str | PathLike[str], *, create: bool) -> int | None:
    """A descriptor of ``$CHOIR_HOME/serve`` once it is checked; None when it does not exist
    (and ``create`` is false).

    Raises:
        UserError: it is a link, not a folder, not this user's, or open to others.
    """
    path = os.path.join(home, FOLDER)
    if create:
        os.makedirs(home, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{path}: a link or not a folder ({exc.strerror})\n"
                          f"  fix: remove it; `choir serve` makes its own") from None
    info = os.fstat(fd)
    problem = (f"owned by uid {info.st_uid}, not you" if info.st_uid != os.geteuid() else
               f"open to others (mode {stat.S_IMODE(info.st_mode):o})"
               if info.st_mode & 0o077 else "")
    if problem:
        os.close(fd)
        raise UserError(f"{path}: {problem}\n  fix: remove it (someone else may have made "
                          "it); `choir serve` makes its own, owner-only")
    return fd


def socket_address(fd: int) -> str:
    """The socket's address, resolved from the checked folder's descriptor."""
    return f"/proc/self/fd/{fd}/{SOCKET}"


def check_socket(fd: int) -> bool:
    """True when the folder holds a socket of this user's (no link, nothing else).

    Raises:
        UserError: something else sits at its name.
    """
    try:
        info = os.stat(SOCKET, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
        raise UserError(f"{SOCKET} in the service's folder is not your socket "
                          f"(mode {info.st_mode:o}, uid {info.st_uid})\n"
                          "  fix: remove it; `choir serve` makes its own")
    return True


__all__ = ["FOLDER", "LOCK", "LOG", "SOCKET", "check_socket", "folder", "open_folder",
           "socket_address"]
