"""One registry shape for every pluggable kind: sandboxes, parsers, reporters, executors,
verifier presets (and, reserved, postconditions).

A registry maps a name to ``"module:attr"``; nothing is imported until that name is used, so
checking a configuration's names costs no import of a backend. Third parties add names with
an entry point in the kind's group (for example ``[project.entry-points."choir.sandboxes"]``
``mine = "my_pkg.box:MySandbox"``); a built-in name always wins over a plugin of the same
name, so installing a package can never silently replace ``bwrap``. Unknown names fail when
the configuration loads, with a did-you-mean and how to install a plugin.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from choir._core import warm
from choir._core.errors import UnknownNameError

T = TypeVar("T")

GROUPS = {
    "sandbox": "choir.sandboxes",
    "parser": "choir.parsers",
    "reporter": "choir.reporters",
    "executor": "choir.executors",
    "preset": "choir.presets",
    "postcondition": "choir.postconditions",  # reserved
}


# A path entry changed this close to a scan may change again within its file system's
# timestamp tick and keep its mtime (git's racy-timestamp rule): such a scan is not kept.
RACY_S = 1.0
_scan: tuple[tuple[Any, ...], dict[str, dict[str, str]]] | None = None


def _fingerprint() -> tuple[Any, ...]:
    """What the entry points installed depend on: the path ``importlib.metadata`` searches,
    each entry's folder and its mtime (installing or replacing a package adds or renames a
    ``.dist-info`` folder in it), and the finders asked."""
    entries = []
    for entry in sys.path:
        try:  # an entry is usually a folder's name, but may be anything a path hook takes
            place: Any = os.path.abspath(entry or ".")
            mtime: int | None = os.stat(place).st_mtime_ns
        except (OSError, TypeError, ValueError):
            place, mtime = id(entry), None
        entries.append((entry, place, mtime))
    return tuple(entries), tuple(map(id, sys.meta_path))


@warm.cached
def installed() -> dict[str, dict[str, str]]:
    """Every plugin installed, of every kind: group -> name -> ``"module:attr"``.

    One scan of every distribution's metadata serves all registries; a process asks again
    only when its path or an entry's mtime changed (a scan costs 15-50 ms: every installed
    package's ``entry_points.txt`` read). A ``.dist-info`` file edited in place, which
    leaves its folder's mtime alone, is not seen until the path changes (pip never does
    that: it writes a new folder); ``importlib.metadata`` itself lists each folder by its
    mtime too.
    """
    global _scan
    key = _fingerprint()
    if _scan is not None and _scan[0] == key:
        return _scan[1]
    from importlib.metadata import entry_points

    started = time.time_ns()
    every = entry_points()
    found = {group: {ep.name: ep.value for ep in every.select(group=group)}
             for group in GROUPS.values()}
    settled = started - int(RACY_S * 1e9)
    if all(mtime is None or mtime < settled for _, _, mtime in key[0]):
        _scan = key, found
    return found


def load_target(spec: str) -> object:
    """Import ``"module:attr"`` (``attr`` may be dotted) and return the attribute."""
    module, _, attr = spec.partition(":")
    value: object = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        value = getattr(value, part)
    return value


class Registry(Generic[T]):
    """Names of one kind -> ``"module:attr"``, loaded lazily and cached."""

    def __init__(self, kind: str, builtin: Mapping[str, str], *,
                 extra_names: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.group = GROUPS[kind]
        self._builtin = dict(builtin)
        self._extra = extra_names  # names handled by the caller itself (``auto``)
        self._registered: dict[str, T] = {}
        self._loaded: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register an object in this process (tests, embedding applications)."""

        def decorate(obj: T) -> T:
            self._registered[name] = obj
            self._loaded.pop(name, None)
            return obj

        return decorate

    def unregister(self, name: str) -> None:
        """Forget an object registered in this process (tests clean up with this)."""
        self._registered.pop(name, None)
        self._loaded.pop(name, None)

    def _plugins(self) -> dict[str, str]:
        return installed().get(self.group, {})

    def specs(self) -> dict[str, str]:
        """Every name with its ``module:attr``: plugins first, built-ins over them."""
        return {**self._plugins(), **self._builtin}

    def names(self) -> list[str]:
        return sorted({*self.specs(), *self._registered, *self._extra})

    def hint(self, name: str) -> str:
        """What to tell a user who wrote ``name``: the closest name, the known ones, a plugin."""
        known = self.names()
        close = difflib.get_close_matches(name, known, n=1)
        return ((f"did you mean '{close[0]}'? " if close else "")
                + f"known: {', '.join(known)}; another {self.kind} is installed as a package "
                f"with a '{self.group}' entry point (pip install it into this environment)")

    def get(self, name: str) -> T:
        """The object registered under ``name``, imported on first use.

        Raises:
            UnknownNameError: no built-in, plugin or registered object has that name.
        """
        if name in self._registered:
            return self._registered[name]
        if name in self._loaded:
            return self._loaded[name]
        spec = self._builtin.get(name) or self._plugins().get(name)
        if spec is None:
            raise UnknownNameError(f"unknown {self.kind} '{name}'; {self.hint(name)}")
        value: T = load_target(spec)  # type: ignore[assignment]
        if name in self._registered:  # an entry point naming a module that registers itself
            return self._registered[name]
        self._loaded[name] = value
        return value


# Every built-in plugin by name, in one place, as strings: checking a configuration's names
# imports none of them. Each kind's module uses its registry (typed there).
SANDBOXES: Registry[Any] = Registry("sandbox", {
    "docker": "choir.sandbox.docker:DockerSandbox",
    "bwrap": "choir.sandbox.bwrap:BwrapSandbox",
    "local": "choir.sandbox.local:LocalSandbox",
}, extra_names=("auto",))
PARSERS: Registry[Any] = Registry("parser", {
    "generic": "choir.report.parsers:parse_generic",
    "pytest": "choir.report.parsers:parse_pytest_text",
    "junit": "choir.report.junit:parse_junit",
    "ruff": "choir.report.lint:parse_ruff",
    "mypy": "choir.report.lint:parse_mypy",
    "sarif": "choir.report.lint:parse_sarif",
    "postcondition": "choir.report.postcondition:parse_postcondition",
})
# a reporter words the deterministic report: async (report, *, result, store, model,
# deadline_s) -> VerificationReport, bounded by choir.report.build.bounded whoever wrote it
REPORTERS: Registry[Any] = Registry("reporter", {
    "deterministic": "choir.report.reporter:as_built",
    "model": "choir.report.reporter:model_report",
})
EXECUTORS: Registry[Any] = Registry("executor", {
    "command": "choir.executors:run_command",
    "python": "choir.executors:run_python",
    "agent": "choir.executors:run_agent",
    "llm": "choir.agent.executor:run_llm",  # imports the agent stack, only when used
})
# built-in presets are data (policies/presets.yaml); a plugin's entry point names a mapping
PRESETS: Registry[Any] = Registry("preset", {})
POSTCONDITIONS: Registry[Any] = Registry("postcondition", {})  # reserved
