"""A process's standing beyond its uid, as the kernel reports it: two ``/proc`` files and
its gids. Read by the client of ``choir serve`` on every warm request and by
``choir.trusted.confine`` before it changes the process's namespaces, so standard library
only (``os``), and nothing parsed here."""

from __future__ import annotations

import os


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def snapshot() -> tuple[str, str, str]:
    """The text of ``/proc/self/status`` and ``/proc/self/attr/current`` (the LSM label),
    and the gids (real, effective, then the supplementary ones sorted)."""
    gids = [os.getgid(), os.getegid(), *sorted(set(os.getgroups()))]
    return (_read("/proc/self/status"), _read("/proc/self/attr/current"),
            " ".join(map(str, gids)))


__all__ = ["snapshot"]
