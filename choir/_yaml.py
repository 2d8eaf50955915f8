"""YAML loading that remembers where every value came from, so errors name file and line."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from choir.exceptions import ConfigError


@dataclass(frozen=True)
class YamlDoc:
    """A parsed YAML file: plain data plus the ruamel tree that knows line numbers."""

    path: Path
    data: Any
    _tree: Any

    def line_of(self, loc: Sequence[str | int]) -> int | None:
        """1-based line of the deepest node on ``loc`` that exists in the file."""
        node, line = self._tree, 1 if self._tree is not None else None
        for key in loc:
            lc = getattr(node, "lc", None)
            try:
                if isinstance(node, dict) and key in node:
                    if lc is not None:
                        line = lc.key(key)[0] + 1
                    node = node[key]
                elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
                    if lc is not None:
                        line = lc.item(key)[0] + 1
                    node = node[key]
                else:
                    break
            except (KeyError, IndexError, TypeError):
                break
        return line


def load_yaml(path: Path) -> YamlDoc:
    """Parse ``path``; a syntax error becomes a ConfigError naming the line.

    Raises:
        ConfigError: the file is missing, unreadable, or not valid YAML.
    """
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read file: {exc}", path=str(path)) from None
    yaml = YAML(typ="rt")
    try:
        tree = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(
            f"invalid YAML: {problem}",
            path=str(path),
            line=line,
            hint="check indentation and that every 'key: value' has a space after the colon",
        ) from None
    except YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", path=str(path)) from None
    return YamlDoc(path=path, data=_plain(tree), _tree=tree)


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if hasattr(node, "value") and type(node).__module__.startswith("ruamel"):
        return node.value  # pragma: no cover - scalar wrappers are rare in rt mode
    return node


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside an annotation such as ``tuple[M, ...]`` or ``M | None``."""
    if hasattr(annotation, "model_fields"):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _allowed_fields(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """Field names valid at the parent of ``loc``, best effort, for "did you mean" hints."""
    current: Any = model
    annotation: Any = model
    for key in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if isinstance(key, str) and fields is not None and key in fields:
            annotation = fields[key].annotation
            current = _model_in(annotation)
        elif current is None or isinstance(key, int) or fields is None or key not in fields:
            # a list index or a dict key (e.g. a verifier name): step into the item type
            current = _model_in(annotation)
        if current is None:
            return []
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else []


def validate(
    doc: YamlDoc, model: type[BaseModel], data: Any | None = None, prefix: tuple[str, ...] = ()
) -> Any:
    """Validate ``data`` (default: the whole document, else the node at ``prefix``) into
    ``model``; the first error becomes a ConfigError with its line and a fix.

    Raises:
        ConfigError: the first validation error, with its line and a fix.
    """
    try:
        return model.model_validate(doc.data if data is None else data)
    except ValidationError as exc:
        errors = exc.errors()
        # an unknown key usually explains a "missing" one beside it (a typo): report it first
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = tuple(err["loc"])
        full = (*prefix, *loc)
        dotted = ".".join(str(p) for p in full) or "(top level)"
        hint = None
        if err["type"] == "extra_forbidden":
            allowed = _allowed_fields(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            if close:
                hint = f"did you mean '{close[0]}'? allowed keys here: {', '.join(allowed)}"
            elif allowed:
                hint = f"remove it; allowed keys here: {', '.join(allowed)}"
            else:
                hint = "remove it"
            message = f"unknown key '{dotted}'"
        elif err["type"] == "missing":
            message = f"'{dotted}' is required"
            hint = f"add '{loc[-1]}:'"
        else:
            message = f"'{dotted}': {err['msg']}"
            ctx = err.get("ctx") or {}
            if "expected" in ctx:
                hint = f"use one of {ctx['expected']}"
        raise ConfigError(message, path=str(doc.path), line=doc.line_of(full), hint=hint) from None
