"""The layers of docs/architecture.md hold: import-linter's contract in pyproject.toml.

A package that imports from a layer above it (even inside a function) fails here, so the
README's test command and CI both check the import graph.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _lint_imports() -> str:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is in the dev extra: pip install -e '.[dev]'"
    return exe


def test_every_layer_imports_only_downward() -> None:
    out = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken" in out.stdout  # layers, and reports vs postconditions


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    """The contract is not vacuous: the same layers on a copy with one upward import fail."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "choir", copy / "choir",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    models = copy / "choir" / "models" / "atom.py"
    models.write_text(models.read_text() + "\n\ndef _up() -> None:\n"
                      "    from choir.graph import runner  # noqa: F401\n")
    out = subprocess.run([_lint_imports(), "--no-cache"], cwd=copy, capture_output=True,
                         text=True, timeout=120, check=False,
                         env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0
    assert "choir.models is not allowed to import choir.graph" in out.stdout
