"""Process-lifetime caches that only a warm service turns on.

A few answers cost a cold command tens of milliseconds each and cannot change while the code
stays the same: the packaged mood policy (a YAML parse, 28 ms on a slow machine) and the
plugins installed (an entry-point scan of every distribution, 15 ms). ``choir serve`` turns
caching on and computes them once, before it forks its workers; a change they depend on (an
edit of the packaged files, a package installed) changes the code digest clients compare
(``choir.serve.stale``), so a stale service is never asked. Cached values are immutable
(frozen models) or only read.

A cold command's process keeps them too (``memoize``, at the CLI's entry): it asked for the
policy three times and scanned the plugins five times per ``choir verify`` (115 ms), and one
command reading its policy and plugins once is what a command should see (a package
installed while a long ``choir run`` runs is not picked up midway, as the service would not
pick it up either). A library caller (an embedding application, a test that installs a
plugin in process) gets fresh answers, as before: only ``enable`` and ``memoize`` keep them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_enabled = False
_memo = False


def enable() -> None:
    """Turn the caches on for the rest of this process (and its forks)."""
    global _enabled
    _enabled = True


def memoize() -> None:
    """Keep ``cached`` answers for the rest of this process, and nothing else of ``enable``
    (no process-lifetime resource is kept: ``enabled`` stays as it was). For a process that
    runs one command and ends."""
    global _memo
    _memo = True


def enabled() -> bool:
    """Whether the caches are on (process-lifetime resources, such as a git object reader
    kept between calls, are kept only then)."""
    return _enabled


def cached(fn: F) -> F:
    """``fn`` computed once per argument tuple while caching is on; every call otherwise."""
    memo: dict[tuple[Any, ...], Any] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        if not (_enabled or _memo):
            return fn(*args)
        if args not in memo:
            memo[args] = fn(*args)
        return memo[args]

    return wrapper  # type: ignore[return-value]


__all__ = ["cached", "enable", "enabled", "memoize"]
