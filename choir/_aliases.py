"""Import paths from before the package layout (issue #12), kept for one release.

``import choir.tree`` gives the very module ``choir.evidence.tree`` (same object: every name,
private ones and monkeypatching included), and a checkpoint that names ``choir.split`` still
finds ``ParentFrame`` there. A finder answers these names instead of files left at the old
paths, so the moves stay plain renames in git.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from types import ModuleType

OLD_PATHS = {
    "choir._canonical": "choir._core.canonical",
    "choir._paths": "choir._core.paths",
    "choir._resources": "choir._core.resources",
    "choir._terminal": "choir._core.terminal",
    "choir._failpoints": "choir._core.failpoints",
    "choir._yaml": "choir.config._yaml",
    "choir.policy": "choir.config.policy",
    "choir.presets": "choir.config.presets",
    "choir.artifacts": "choir.evidence.artifacts",
    "choir.tree": "choir.evidence.tree",
    "choir.pipeline": "choir.verification.pipeline",
    "choir.director_model": "choir.director.advisor",
    "choir.lenses": "choir.director.lenses",
    "choir.split": "choir.director.split",
    "choir.verify": "choir.app.verify",
    "choir.gate": "choir.app.gate",
    "choir.attest.verify": "choir.attest.check",
    "choir.report.model": "choir.report.reporter",
    "choir.agent.model": "choir.agent.llm",
    "choir.agent.pinned": "choir.executors.pinned",
}


class _Alias:  # a Loader by protocol: importlib.abc would pull in importlib.resources (9 ms)
    """Loads an old name as the new module itself, leaving the new module's spec intact."""

    def __init__(self, new: str) -> None:
        self.new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the import system set the old name's spec on it


class _Finder:  # a MetaPathFinder by protocol
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = OLD_PATHS.get(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(
            fullname, _Alias(new))  # type: ignore[arg-type]


def install() -> None:
    """Answer the old paths in this process (``import choir`` does it; idempotent)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
