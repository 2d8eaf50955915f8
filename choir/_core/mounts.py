"""Whether this process runs in a mount namespace Choir made for it.

``choir.trusted.confine`` unshares one at a command's entry and makes every mount in it
private: a mount made there is seen by this process and its children only, and dies with
the process. Code that mounts (the overlay worktrees, ``choir.evidence.worktrees``) mounts
only then, so nothing is ever left mounted on the host after a crash. The flag lives here,
below both, because the layer that confines is above the one that mounts.
"""

from __future__ import annotations

_private = False
_changes = 0


def mark_private() -> None:
    """Record that this process now runs in a private mount namespace of its own."""
    global _private
    _private = True


def private() -> bool:
    """True once ``mark_private`` was called in this process (not inherited by exec)."""
    return _private


def changed() -> None:
    """Record that this process mounted or unmounted something (``generation``)."""
    global _changes
    _changes += 1


def generation() -> int:
    """How many mounts this process made or removed: a copy of the mount table taken
    before one is stale even when the table reads the same after it. An overlay unmounted
    and mounted again at the same path over the same layers has the same mount id and
    device, so ``/proc/self/mountinfo`` is byte for byte the same, yet a copy taken before
    holds the old mount, whose upper layer is gone (review 16d: a launcher armed then ran
    an item's retry in it, ``bwrap: Can't find source path``)."""
    return _changes
