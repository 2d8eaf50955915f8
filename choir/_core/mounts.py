"""Whether this process runs in a mount namespace Choir made for it.

``choir.trusted.confine`` unshares one at a command's entry and makes every mount in it
private: a mount made there is seen by this process and its children only, and dies with
the process. Code that mounts (the overlay worktrees, ``choir.evidence.worktrees``) mounts
only then, so nothing is ever left mounted on the host after a crash. The flag lives here,
below both, because the layer that confines is above the one that mounts.
"""

from __future__ import annotations

_private = False


def mark_private() -> None:
    """Record that this process now runs in a private mount namespace of its own."""
    global _private
    _private = True


def private() -> bool:
    """True once ``mark_private`` was called in this process (not inherited by exec)."""
    return _private
