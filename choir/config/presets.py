"""Verifier presets: ``uses: pytest`` instead of knowing JUnit, $CHOIR_OUT and cache flags.

A preset is a partial verifier spec (kind, steps, parser, timeout, ...) kept as data in
``policies/presets.yaml``, so adding one needs no code. ``expand`` merges a verifier's raw
``choir.yaml`` mapping over its preset before validation: every field written beside
``uses:`` replaces the preset's field of that name whole (``steps:`` replaces all steps), so
the validated spec, its hash and its attestations never mention presets at all.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from choir._core.registry import PRESETS
from choir._core.resources import data_path, load_text
from choir.config._yaml import YamlDoc
from choir.exceptions import ConfigError

USES = "uses"


def packaged(file: str, key: str, what: str) -> dict[str, dict[str, Any]]:
    """The mapping of presets under ``key`` in the packaged ``policies/{file}``.

    Raises:
        ConfigError: the packaged file is malformed (a packaging bug, named like a user file).
    """
    from io import StringIO

    from ruamel.yaml import YAML

    data = YAML(typ="safe").load(StringIO(load_text("policies", file)))
    presets = data.get(key) if isinstance(data, dict) else None
    if not isinstance(presets, dict) or not all(isinstance(v, dict) for v in presets.values()):
        raise ConfigError(f"'{key}:' must map names to {what} fields",
                          path=str(data_path("policies") / file), line=1)
    return {str(name): dict(spec) for name, spec in presets.items()}


@cache
def load_presets() -> dict[str, dict[str, Any]]:
    """The packaged verifier presets and plugins' by name (read once per process).

    Raises:
        ConfigError: the packaged file or a plugin's preset is malformed.
    """
    found = packaged("presets.yaml", "presets", "verifier")
    for name in PRESETS.names():  # plugins' presets (``choir.presets`` entry points)
        if name not in found:
            spec = PRESETS.get(name)
            if not isinstance(spec, dict):
                raise ConfigError(f"preset plugin '{name}' must name a mapping of verifier "
                                  "fields", path=PRESETS.specs().get(name, name), line=1)
            found[name] = dict(spec)
    return found


def preset_names() -> list[str]:
    return sorted(load_presets())


def expand(doc: YamlDoc, name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with its ``uses:`` preset filled in underneath; unchanged without ``uses:``.

    Raises:
        ConfigError: ``uses:`` is not a string or names no known preset (file, line and the
            known names in the hint).
    """
    if USES not in raw:
        return raw
    chosen = raw[USES]
    presets = load_presets()
    if not isinstance(chosen, str) or chosen not in presets:
        raise ConfigError(
            f"verifier '{name}': unknown preset {chosen!r}",
            path=str(doc.path), line=doc.line_of(("verifiers", name, USES)),
            hint=f"use one of: {', '.join(sorted(presets))}; another preset is installed as a "
                 f"package with a '{PRESETS.group}' entry point")
    own = {key: value for key, value in raw.items() if key != USES}
    return {**presets[chosen], **own}
