"""Held-out checks: verifiers whose files live outside the repo, where no executor looks.

A test the executor can read is a test it can fit: special-case its inputs, hard-code its
outputs, return an object whose ``__eq__`` is always true. So a person may keep checks of
their own in Choir's home, outside every repo, declared in ``$CHOIR_HOME/heldout.yaml``::

    repos:
      - repo: /home/me/src/calc        # the repo they judge (its real path)
        verifiers:
          hidden:                      # a verifier name, unique beside choir.yaml's
            kind: unit_tests
            path: calc                 # under $CHOIR_HOME/heldout/ (default: the name),
                                       # or an absolute folder
            steps:
              - name: pytest
                command: python -c "$CHOIR_PYTEST" -q $CHOIR_HELDOUT
            parser: junit

Each becomes an allowlisted verifier of that repo (planned by kind like any other; PARANOID
plans every one, ``require_heldout``). Its files are hashed when the run's configuration is
pinned; only its own green thread sees them, copied into a sealed, read-only copy of the
verified tree at ``$CHOIR_HELDOUT`` (``choir.evidence.heldout``). The executor's sandbox
masks Choir's home and every held-out folder, and its feedback from these verifiers is
counts only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from choir._core.canonical import blake3_hex, canonical_json
from choir._core.paths import choir_home
from choir.config._yaml import YamlDoc, load_yaml, validation_errors
from choir.config.presets import expand
from choir.exceptions import ConfigError
from choir.models import VerifierKind, VerifierSpec

HELDOUT_FILE = "heldout.yaml"
HELDOUT_DIR = ".choir-heldout"  # where the files appear in the tree a held-out verifier reads
_SKIP = ("__pycache__", ".pytest_cache")


def heldout_file() -> Path:
    """The user's held-out configuration: ``$CHOIR_HOME/heldout.yaml``."""
    return choir_home() / HELDOUT_FILE


def heldout_root() -> Path:
    """Where held-out folders named by a relative ``path:`` live."""
    return choir_home() / "heldout"


def files_of(folder: Path) -> dict[str, str]:
    """``{relative posix path: blake3}`` of every regular file under ``folder`` (caches
    skipped). A symlink is refused: a copy would follow it out of the folder.

    Raises:
        ConfigError: a symlink, or an unreadable file.
    """
    found: dict[str, str] = {}
    for dirpath, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP)
        for name in sorted(names):
            path = Path(dirpath) / name
            st = path.lstat()
            rel = path.relative_to(folder).as_posix()
            if stat.S_ISLNK(st.st_mode):
                raise ConfigError(f"held-out file {rel} is a symlink", path=str(path),
                                  hint="copy the file into the held-out folder")
            if stat.S_ISREG(st.st_mode):
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as fh:
                    found[rel] = blake3_hex(fh.read())
    return found


def files_hash(files: dict[str, str]) -> str:
    return blake3_hex(canonical_json({"schema": "choir.heldout/v1", "files": files}))


def _entry_errors(doc: YamlDoc, i: int, entry: Any) -> list[ConfigError]:
    if isinstance(entry, dict) and isinstance(entry.get("repo"), str) and \
            isinstance(entry.get("verifiers"), dict):
        return []
    return [ConfigError(f"repos[{i}] must have 'repo:' (a path) and 'verifiers:' (a mapping)",
                        path=str(doc.path), line=doc.line_of(("repos", i)),
                        hint="see 'Held-out checks' in the README")]


def _spec(doc: YamlDoc, loc: tuple[Any, ...], name: str,
          raw: Any) -> tuple[VerifierSpec | None, list[ConfigError]]:
    file, line = str(doc.path), doc.line_of(loc)
    if not isinstance(raw, dict):
        return None, [ConfigError(f"held-out verifier '{name}' must be a mapping", path=file,
                                  line=line, hint="give it 'kind:', 'path:' and 'steps:'")]
    raw = dict(raw)
    folder = Path(os.path.expanduser(str(raw.pop("path", name))))
    folder = folder if folder.is_absolute() else heldout_root() / folder
    if not folder.is_dir():
        return None, [ConfigError(f"held-out verifier '{name}': folder {folder} does not "
                                  "exist", path=file, line=line,
                                  hint="create it and put the checks in it")]
    try:
        expanded = expand(doc, name, raw)
        files = files_of(folder)
    except ConfigError as err:
        return None, [err]
    env = {**dict(expanded.get("env") or {}), "CHOIR_HELDOUT": HELDOUT_DIR}
    spec, errors = validation_errors(doc, VerifierSpec, {
        **expanded, "name": name, "env": env,
        "heldout": {"path": str(folder.resolve()), "files_hash": files_hash(files)}},
        prefix=loc)
    if spec is not None and spec.kind in (VerifierKind.TRACE, VerifierKind.MUTATION):
        return None, [ConfigError(f"held-out verifier '{name}': kind {spec.kind.value} runs "
                                  "Choir's own checks, not held-out files", path=file, line=line,
                                  hint="use kind unit_tests (or another test kind)")]
    return spec, errors


def load_heldout(repo: Path, taken: set[str] | frozenset[str] = frozenset()) -> dict[
        str, VerifierSpec]:
    """The held-out verifiers the user's ``heldout.yaml`` declares for ``repo`` (none
    without the file).

    Raises:
        ConfigError: the file is malformed, a folder is missing, or a name is already one of
            ``taken`` (the repo's own verifiers). Every mistake at once.
    """
    path = heldout_file()
    if not os.path.lexists(path):  # only absence is "none": a dangling link or a folder is
        return {}  # a mistake load_yaml names (PARANOID ran without its checks: review 16c)
    doc = load_yaml(path)
    data = doc.data if isinstance(doc.data, dict) else None
    repos = data.get("repos") if data is not None else None
    if not isinstance(repos, list):
        raise ConfigError("heldout.yaml must be a mapping with a 'repos:' list",
                          path=str(path), line=1,
                          hint="write 'repos: [{repo: /path/to/repo, verifiers: {...}}]'")
    errors: list[ConfigError] = []
    found: dict[str, VerifierSpec] = {}
    real = repo.expanduser().resolve()
    for i, entry in enumerate(repos):
        bad = _entry_errors(doc, i, entry)
        errors += bad
        if bad or Path(os.path.expanduser(entry["repo"])).resolve() != real:
            continue
        for name, raw in entry["verifiers"].items():
            loc = ("repos", i, "verifiers", name)
            if name in taken or name in found:
                errors.append(ConfigError(f"held-out verifier '{name}' is already a verifier "
                                          "of this repo", path=str(path),
                                          line=doc.line_of(loc), hint="rename it"))
                continue
            spec, spec_errors = _spec(doc, loc, str(name), raw)
            errors += spec_errors
            if spec is not None and not spec_errors:
                found[str(name)] = spec
    ConfigError.raise_all(errors)
    return found


def heldout_paths() -> list[Path]:
    """Every folder ``heldout.yaml`` names, for any repo: masked in an executor's sandbox
    (those under Choir's home are masked with it). Unreadable configuration: none here (the
    run refuses it when it loads the repo's configuration)."""
    try:
        doc = load_yaml(heldout_file())
    except (ConfigError, OSError):
        return []
    data = doc.data if isinstance(doc.data, dict) else {}
    out: list[Path] = [heldout_root()]
    for entry in data.get("repos") or ():
        verifiers = entry.get("verifiers") if isinstance(entry, dict) else None
        for name, raw in (verifiers or {}).items() if isinstance(verifiers, dict) else ():
            given = raw.get("path", name) if isinstance(raw, dict) else name
            folder = Path(os.path.expanduser(str(given)))
            out.append(folder if folder.is_absolute() else heldout_root() / folder)
    return [p.resolve() for p in out if p.exists()]
