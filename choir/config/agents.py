"""Agent programs as executors: ``uses: claude-code`` under ``executor:``, and what they need.

A preset (``policies/agents.yaml``) is a partial executor spec: ``kind: agent``, the
program's non-interactive command line, the hosts of its model API, the variables it may
have from the environment. ``expand`` merges the work item's own ``executor:`` fields over
it before validation (a field written beside ``uses:`` replaces the preset's whole), so the
validated work item never mentions presets. ``problems`` then checks, before anything runs,
what would otherwise fail inside the sandbox with a bare ``command not found``: the program
is on PATH and installed where the sandbox can see it, and a model API moved by the
environment (``ANTHROPIC_BASE_URL`` and friends) is on the host list.
"""

from __future__ import annotations

import os
import shlex
import shutil
import urllib.parse
from functools import cache
from pathlib import Path
from typing import Any

from choir._core.hosts import parse_host
from choir.config._yaml import YamlDoc
from choir.config.presets import USES, packaged
from choir.exceptions import ConfigError
from choir.models.workitem import ExecutorSpec
from choir.sandbox._toolchain import check_bind

META = ("program", "install", "base_url_env")  # read at load, never executor fields
# what every executor sandbox sees read-only besides the repo's parent and the binds
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc")
_PORTS = {"http": 80, "https": 443}


@cache
def executor_presets() -> dict[str, dict[str, Any]]:
    """The packaged executor presets by name (read once per process).

    Raises:
        ConfigError: the packaged file is malformed (a packaging bug, named like a user file).
    """
    return packaged("agents.yaml", "executors", "executor")


def expand(doc: YamlDoc, loc: tuple[str | int, ...], raw: Any) -> tuple[Any, dict[str, Any]]:
    """``(fields, meta)``: ``raw`` with its ``uses:`` preset underneath, and the preset's
    load-time facts (``META``); ``raw`` unchanged and no facts without ``uses:``.

    Raises:
        ConfigError: ``uses:`` names no preset (file, line and the known names).
    """
    if not isinstance(raw, dict) or USES not in raw:
        return raw, {}
    presets = executor_presets()
    chosen = raw[USES]
    if not isinstance(chosen, str) or chosen not in presets:
        raise ConfigError(f"executor: unknown preset {chosen!r}", path=str(doc.path),
                          line=doc.line_of((*loc, USES)),
                          hint=f"use one of: {', '.join(sorted(presets))}, or write "
                               "'kind: agent' with your own 'command:'")
    preset = presets[chosen]
    meta = {key: preset[key] for key in META if key in preset}
    fields = {key: value for key, value in preset.items() if key not in META}
    return {**fields, **{k: v for k, v in raw.items() if k != USES}}, meta


def expand_keys(doc: YamlDoc, raw: Any, loc: tuple[str | int, ...],
                keys: tuple[str, ...] = ("executor", "escalate_to")
                ) -> tuple[Any, dict[str, dict[str, Any]], list[ConfigError]]:
    """``(data, meta by key, errors)``: the mapping at ``loc`` with the executor specs under
    ``keys`` expanded (a work item's ``executor`` and ``escalate_to``)."""
    if not isinstance(raw, dict):
        return raw, {}, []
    data, meta, errors = dict(raw), {}, []
    for key in keys:
        if key in data:
            try:
                data[key], meta[key] = expand(doc, (*loc, key), data[key])
            except ConfigError as err:
                errors.append(err)
    return data, meta, errors


def expand_plan(doc: YamlDoc) -> tuple[Any, list[ConfigError]]:
    """A plan file's data with the presets of its members' and items' executors filled in."""
    data = doc.data
    if not isinstance(data, dict):
        return data, []
    data, errors = dict(data), []
    members = data.get("members")
    if isinstance(members, dict):
        data["members"] = {}
        for name, member in members.items():
            data["members"][name], _, found = expand_keys(doc, member, ("members", name),
                                                          ("executor",))
            errors += found
    items = data.get("items")
    if isinstance(items, list):
        data["items"] = []
        for i, item in enumerate(items):
            expanded, _, found = expand_keys(doc, item, ("items", i))
            data["items"].append(expanded)
            errors += found
    return data, errors


def problems(doc: YamlDoc, loc: tuple[str, ...], spec: ExecutorSpec, repo: Path,
             meta: dict[str, Any]) -> list[ConfigError]:
    """What would keep an ``agent`` executor (or any with ``binds``) from working."""
    errors: list[ConfigError] = []
    for i, bind in enumerate(spec.binds):
        try:
            check_bind(bind, origin=f"executor.binds[{i}]")
        except ConfigError as exc:
            errors.append(ConfigError(exc.message, path=str(doc.path),
                                      line=doc.line_of((*loc, "binds", i)),
                                      hint="bind the exact folder the program is installed in"))
    if spec.kind != "agent" or not spec.command or errors:
        return errors
    path, line = str(doc.path), doc.line_of(loc)
    program = _program(spec.command)
    if program is not None and "/" not in program:
        found = shutil.which(program)
        if found is None:
            install = meta.get("install")
            errors.append(ConfigError(
                f"executor: '{program}' is not on PATH", path=path, line=line,
                hint=(f"install it ({install}), " if install else "install it, ")
                + "or give 'command:' its full path"))
        else:
            errors += _hidden_program(program, Path(found), repo, spec.binds, path, line)
    for variable in meta.get("base_url_env", ()):
        moved = _endpoint(os.environ.get(variable, ""))
        if moved is not None and moved not in spec.hosts:
            errors.append(ConfigError(
                f"executor: {variable} points the agent at {moved}, which is not on its "
                f"host list ({', '.join(spec.hosts) or 'empty'})", path=path,
                line=doc.line_of((*loc, "hosts")) or line,
                hint=f"add 'hosts: [{moved}]' under 'executor:' (it replaces the preset's "
                     "list), or unset the variable"))
    return errors


def _program(command: str) -> str | None:
    """The program a shell command starts, past any ``NAME=value`` assignments."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for word in words:
        name, eq, _ = word.partition("=")
        if not (eq and name.isidentifier()):
            return word
    return None


def _hidden_program(program: str, found: Path, repo: Path, binds: tuple[str, ...],
                    path: str, line: int | None) -> list[ConfigError]:
    """An error when the sandbox would not see ``found`` (or what its link leads to)."""
    roots = [Path(p) for p in (*_SYSTEM, *binds)] + [repo.parent]
    hidden = [p for p in dict.fromkeys((found.parent, Path(os.path.realpath(found)).parent))
              if not any(p == r or p.is_relative_to(r) for r in roots)]
    if not hidden:
        return []
    return [ConfigError(
        f"executor: '{program}' is installed at {found}, which the executor's sandbox "
        "does not see (it sees /usr, the repo's parent folder and 'binds:')",
        path=path, line=line,
        hint=f"add 'binds: [{', '.join(map(str, hidden))}]' under 'executor:', or install "
             "it under /usr (npm install -g as root does)")]


def _endpoint(url: str) -> str | None:
    """``host:port`` of a base URL, or None when there is none to check."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or parts.scheme not in _PORTS:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    try:
        return str(parse_host(f"{host}:{parts.port or _PORTS[parts.scheme]}"))
    except ValueError:
        return None
