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


def test_no_import_is_exempt_from_the_layers() -> None:
    """The attestation index reached the AHDB's Postgres backend past the layers (an
    ``ignore_imports`` entry); both stores now share ``choir.config.database`` below them."""
    assert "ignore_imports" not in (ROOT / "pyproject.toml").read_text()


def test_every_module_lives_in_a_concept_package() -> None:
    """Top level: the package's entry points, the public errors and the one model gateway
    (used alike by the reporter, the Director and the Agent); every other module belongs
    to the package whose concept it serves, and that package has a layer."""
    loose = sorted(p.name for p in (ROOT / "choir").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "_version.py", "exceptions.py", "llm.py"]
    layers = (ROOT / "pyproject.toml").read_text()
    for package in sorted(p.parent.name for p in (ROOT / "choir").glob("*/__init__.py")):
        assert f'"choir.{package}' in layers or f"| choir.{package}" in layers, package


def test_errors_keep_their_public_names() -> None:
    import pickle

    from choir.exceptions import ConfigError, UnknownNameError

    err = ConfigError("bad", path="choir.yaml", line=3, hint="say what")
    assert type(err).__module__ == "choir.exceptions"
    assert isinstance(pickle.loads(pickle.dumps(UnknownNameError("x"))), UnknownNameError)


def test_every_error_class_is_public() -> None:
    import inspect

    from choir import exceptions
    from choir._core import errors

    defined = {n for n, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, BaseException) and c.__module__ in {errors.__name__,
                                                                    exceptions.__name__}}
    assert defined == set(exceptions.__all__) == set(errors.__all__)
