"""The user's files: ``choir.yaml`` (the allowlist) and work items, validated with lines.

Everything here fails before anything runs: a bad file is a ConfigError naming the file, the
line and what to write instead, which the CLI turns into exit code 2.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt

from choir._core.registry import EXECUTORS, PARSERS, REPORTERS, SANDBOXES, Registry
from choir.config import agents
from choir.config._yaml import YamlDoc, load_yaml, validation_errors
from choir.config.presets import expand
from choir.exceptions import ConfigError
from choir.llm import schema_form
from choir.models import Mood, StepSpec, VerifierKind, VerifierSpec, WorkItem
from choir.models._base import Frozen
from choir.models.workitem import ExecutorSpec
from choir.postconditions.decisions import Decision
from choir.sandbox._toolchain import active_venv, check_bind

CONFIG_NAME = "choir.yaml"
PIPELINE = "pipeline"
# What test runners read, pinned from the base tree of a ``choir run`` (``spec:`` replaces
# it). As in .gitignore: a name without ``/`` matches at any depth; ``NAME/`` is every file
# under a folder of that name at any depth; a leading ``/`` or a ``/`` inside anchors the
# glob at the repo root (``*`` within a name, ``**`` across folders).
# pyproject.toml, setup.cfg and tox.ini are pinned whole: pytest reads its options, plugins
# (``-p``) and test paths from them, and an install step runs their build settings, so no
# part of them is safe to leave to the executor; a work item that must change one says so.
# Distribution metadata (``*.dist-info/``, ``*.egg-info/``) on the path is how pytest finds
# plugins to load at start (``pytest11`` entry points), without any conftest.py.
# Doctest files (``test*.txt`` holding an example) are pinned and judged by their content
# too (``choir.evidence.spec``): a ``requirements/test.txt`` is not one.
# The configuration files of the lint, type and security checks and coverage: what they
# report is what these say (review 20a: a change that quiets a check is a change to it).
LINT_CONFIG = ("ruff.toml", ".ruff.toml", "mypy.ini", ".mypy.ini", ".flake8", ".pylintrc",
               "pylintrc", ".bandit", ".coveragerc", ".pyre_configuration",
               "pyrightconfig.json")
DEFAULT_SPEC = (
    "tests/", "test/", "testing/", "test_*.py", "*_test.py", "tests.py", "conftest.py",
    "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
    "pyproject.toml", *LINT_CONFIG,
    "sitecustomize.py", "usercustomize.py", "*.pth", "*.dist-info/", "*.egg-info/",
    "fixtures/", "snapshots/", "__snapshots__/", "verifiers/", CONFIG_NAME,
)


# Pinned whatever ``spec:`` says: this file, and what decides where Python looks: the
# project's venv, which picks every step's interpreter (``choir.sandbox._toolchain.choose``:
# a committed ``.venv`` would be the tree's own, faking any report), ``conda-meta/`` (its
# ``history`` makes pytest skip the folder as an environment) and ``src`` as a file or a
# link (an import root that is a zip, or another folder)
ALWAYS_SPEC = (CONFIG_NAME, "/.venv/", "pyvenv.cfg", "conda-meta/", "/src")


class ModelsConfig(Frozen):
    """litellm model names per role; absent means deterministic behaviour for that role."""

    reporter: str | None = None
    director: str | None = None
    executor: str | None = None


class SandboxConfig(Frozen):
    """Which sandbox runs verifiers; ``auto``: docker, else bwrap, else local (unsafe)."""

    backend: str = "auto"
    image: str | None = None
    # the project's interpreter (a python executable or a venv folder; relative to the repo),
    # else VIRTUAL_ENV, else the repo's .venv: see choir/sandbox/_toolchain.py
    python: str | None = None
    # extra read-only folders a step may see; never one containing CHOIR_HOME, the artifact
    # store or $HOME (refused with a ConfigError)
    binds: tuple[str, ...] = ()
    # docker only: bind mounts, or copy through the API (a remote engine); auto copies when
    # DOCKER_HOST is tcp:// or ssh://
    transfer: Literal["auto", "bind", "copy"] | None = None


class MoodOverride(Frozen):
    """A mood as ``choir.yaml`` may override it: verifier names from the allowlist."""

    verifiers: tuple[str, ...] | None = None
    broaden: tuple[str, ...] | None = None
    # strict: `'yes'`, `1` or `'no'` are refused, not read as booleans behind the check
    # that a repo never loosens a mood (review 20c: PARANOID ran in `local`)
    reruns: StrictInt | None = Field(default=None, ge=1, le=5)
    allow_unsafe_isolation: StrictBool | None = None
    require_limits: StrictBool | None = None


class _Pipeline(Frozen):
    steps: tuple[StepSpec, ...] = Field(min_length=1)
    timeout_s: float = Field(default=600.0, gt=0)
    parser: str = "generic"


class _ChoirFile(Frozen):
    verification: _Pipeline | None = None
    verifiers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    models: ModelsConfig = Field(default_factory=ModelsConfig)
    # which reporter words reports (a REPORTERS name); default: model when models.reporter
    # names a model, else deterministic
    reporter: str | None = None
    moods: dict[Mood, MoodOverride] = Field(default_factory=dict)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    max_parallel: int | None = Field(default=None, ge=1, le=64)
    resources: dict[str, dict[str, Any]] = Field(default_factory=dict)  # postconditions'
    decisions: dict[str, Decision] = Field(default_factory=dict)
    spec: tuple[str, ...] | None = None


class RepoConfig(Frozen):
    """A repo's validated configuration. ``verifiers`` is the allowlist: nothing else runs."""

    path: str
    source: str
    verifiers: dict[str, VerifierSpec]
    models: ModelsConfig = Field(default_factory=ModelsConfig)
    reporter: str | None = None
    moods: dict[Mood, MoodOverride] = Field(default_factory=dict)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    max_parallel: int | None = None
    lines: dict[str, int] = Field(default_factory=dict)
    decisions: dict[str, Decision] = Field(default_factory=dict)
    # the paths that define success (globs), pinned when a ``choir run`` starts: ``spec:``
    # or DEFAULT_SPEC, always with choir.yaml and the allowlist's callable verifier files
    spec: tuple[str, ...] = DEFAULT_SPEC

    def reporter_name(self) -> str:
        """The reporter that words reports: ``reporter:``, else ``model`` when
        ``models.reporter`` names a model, else ``deterministic``."""
        return self.reporter or ("model" if self.models.reporter else "deterministic")


def _verifier_spec(doc: YamlDoc, name: str, raw: Any,
                   resources: dict[str, Any] | None = None) -> tuple[VerifierSpec | None,
                                                                     list[ConfigError]]:
    budget = _decision_budgets(doc).get(name)
    if isinstance(raw, dict) and ("name" in raw or "schema_version" in raw):
        key = "name" if "name" in raw else "schema_version"
        return None, [ConfigError(f"unknown key 'verifiers.{name}.{key}'", path=str(doc.path),
                                  line=doc.line_of(("verifiers", name, key)),
                                  hint="a verifier is named by its key under 'verifiers:'")]
    if not isinstance(raw, dict):
        return None, [ConfigError(f"verifier '{name}' must be a mapping", path=str(doc.path),
                                  line=doc.line_of(("verifiers", name)),
                                  hint="give it 'kind:' and 'steps:'")]
    from choir.postconditions.spec import expand as postcondition
    from choir.postconditions.spec import is_postcondition

    try:
        expanded = (postcondition(doc, name, raw, resources or {}, budget)
                    if is_postcondition(raw)
                    else expand(doc, name, raw))
    except ConfigError as err:
        return None, [err]
    spec, errors = validation_errors(doc, VerifierSpec, {**expanded, "name": name},
                                     prefix=("verifiers", name))
    return spec, errors


def _loosened(doc: YamlDoc, mood: str, override: dict[str, Any],
              verifiers: dict[str, VerifierSpec]) -> list[ConfigError]:
    """A mood's sandbox isolation, resource limits, reruns, or (in a guarded mood:
    PARANOID) its verifiers loosened by the repo: refused. The repo's ``choir.yaml`` is a
    file an executor (or a pull request) can write; it may tighten a mood, never loosen
    what the packaged policy requires. A guarded mood runs every allowlisted verifier of its
    kinds: its list may add to them, never leave one out (``choir.config.policy.guarded``)."""
    from choir.config.policy import guarded, load_packaged_policy

    try:
        base = load_packaged_policy().moods.get(Mood(mood))
    except ValueError:
        return []  # not a mood: said where the moods are validated
    if base is None:
        return []
    found = []
    reruns = override.get("reruns")
    if isinstance(reruns, int) and reruns < base.reruns:
        found.append(ConfigError(
            f"mood {mood}: choir.yaml cannot loosen reruns to {reruns} (the mood policy "
            f"runs each verifier {base.reruns} times, independently): the repo is a file an "
            "executor can write", path=str(doc.path),
            line=doc.line_of(("moods", mood, "reruns")),
            hint=f"remove reruns here, or set it to {base.reruns} or more"))
    listed = override.get("verifiers")
    if guarded(base) and isinstance(listed, list):
        left = [n for n, spec in verifiers.items()
                if spec.kind in base.kinds and n not in listed]
        if left:
            found.append(ConfigError(
                f"mood {mood}: choir.yaml's list leaves out {', '.join(left)}: {mood} runs "
                "every allowlisted verifier of its kinds, and the repo may add to them, "
                "never remove one", path=str(doc.path),
                line=doc.line_of(("moods", mood, "verifiers")),
                hint=f"add {', '.join(left)} to the list, or drop the list"))
    # anything but the value that keeps the mood as it is loosens it (a YAML `'yes'` or
    # `1` too, whatever the model's validation would make of it)
    for key, loosens in (("allow_unsafe_isolation",
                          override.get("allow_unsafe_isolation") not in (None, False)
                          and not base.allow_unsafe_isolation),
                         ("require_limits", override.get("require_limits") not in (None, True)
                          and base.require_limits)):
        if loosens:
            found.append(ConfigError(
                f"mood {mood}: choir.yaml cannot loosen {key} (the mood policy requires "
                f"{key}: {str(getattr(base, key)).lower()}): the repo is a file an executor "
                "can write", path=str(doc.path), line=doc.line_of(("moods", mood, key)),
                hint=f"remove {key} here, or use a mood that allows it (CALM, SKEPTICAL)"))
    return found


def _reserved(doc: YamlDoc, name: str, loc: tuple[str | int, ...]) -> ConfigError | None:
    """A ConfigError when ``name`` is one Choir gives its own run checks in ``choir run``
    (``choir.config.policy.with_run_checks``): a repo verifier of that name was silently
    replaced by the check, so a failing lint named ``unit.mutants`` never ran and the run
    ASSERTed (review 20, F4)."""
    from choir.config.policy import MUTANTS_SUFFIX, RUN_TRACE_NAME

    if not isinstance(name, str) or not (name.endswith(MUTANTS_SUFFIX)
                                         or name == RUN_TRACE_NAME):
        return None
    what = ("a name ending in '.mutants' is a mutation check's" if name.endswith(MUTANTS_SUFFIX)
            else f"'{RUN_TRACE_NAME}' is the name of Choir's own trace verifier")
    return ConfigError(f"verifier name '{name}' is reserved: {what}, which Choir adds to "
                       "the allowlist of a choir run", path=str(doc.path), line=doc.line_of(loc),
                       hint=f"rename it, e.g. '{name.replace('.', '-')}-check'")


def _checks_nothing(doc: YamlDoc, mood: str, listed: Any,
                    verifiers: dict[str, VerifierSpec]) -> ConfigError | None:
    """A ConfigError when a mood's list names only verifiers that check no code: the run's
    own trace (``kind: trace``) or a mutation check. ``choir run`` would plan them alone and
    ASSERT with nothing of the tree verified (review 20, F5)."""
    if not isinstance(listed, list) or not listed or \
            not all(isinstance(n, str) and n in verifiers for n in listed):
        return None  # empty, or an unknown name: said where the list is checked
    own = (VerifierKind.TRACE, VerifierKind.MUTATION)
    if any(verifiers[n].kind not in own for n in listed):
        return None
    checks = sorted(n for n, spec in verifiers.items() if spec.kind not in own)
    return ConfigError(
        f"mood {mood} names only verifiers that check no code ({', '.join(listed)}; a trace "
        "verifier checks the run's own record): nothing of the tree would be verified",
        path=str(doc.path), line=doc.line_of(("moods", mood, "verifiers")),
        hint=f"add at least one of: {', '.join(checks) or 'a verifier of the code'}")


def _section(data: Any, key: str) -> dict[str, Any]:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def _registered(doc: YamlDoc, loc: tuple[str | int, ...], registry: Registry[Any],
                value: Any, known: list[str]) -> ConfigError | None:
    """A ConfigError when ``value`` is not in ``known`` (``registry``'s names, read once per
    file): did-you-mean, the known names and how a plugin is installed."""
    if not isinstance(value, str) or value in known:
        return None
    return ConfigError(f"unknown {registry.kind} '{value}'", path=str(doc.path),
                       line=doc.line_of(loc), hint=registry.hint(value))


def _unknown_names(doc: YamlDoc) -> list[ConfigError]:
    """Parser, sandbox and reporter names checked at load: a typo must never reach a run."""
    parsers = PARSERS.names()
    found = [_registered(doc, ("verification", "parser"), PARSERS,
                         _section(doc.data, "verification").get("parser"), parsers)]
    for name, raw in _section(doc.data, "verifiers").items():
        if isinstance(raw, dict):
            found.append(_registered(doc, ("verifiers", name, "parser"), PARSERS,
                                     raw.get("parser"), parsers))
    found.append(_registered(doc, ("sandbox", "backend"), SANDBOXES,
                             _section(doc.data, "sandbox").get("backend"), SANDBOXES.names()))
    reporter = doc.data.get("reporter") if isinstance(doc.data, dict) else None
    found.append(_registered(doc, ("reporter",), REPORTERS, reporter, REPORTERS.names()))
    if reporter == "model" and not _section(doc.data, "models").get("reporter"):
        found.append(ConfigError("reporter 'model' needs a model to ask", path=str(doc.path),
                                 line=doc.line_of(("reporter",)),
                                 hint="set models.reporter to a litellm model name (for "
                                      "example gpt-4o-mini), or drop 'reporter:'"))
    return [err for err in found if err is not None]


def _schema_form(doc: YamlDoc) -> list[ConfigError]:
    """``CHOIR_MODEL_SCHEMA`` checked where a structured-reply role has a model: a typo in
    the environment fails before anything runs, not as a reporter fault in every report."""
    models = _section(doc.data, "models")
    if not (models.get("reporter") or models.get("director")):
        return []
    try:
        schema_form()
    except ConfigError as err:
        return [err]
    return []


def _sandbox_section(section: SandboxConfig, repo: Path, doc: YamlDoc) -> SandboxConfig:
    """The ``sandbox:`` section with ``python`` made absolute and every bind checked.

    Raises:
        ConfigError: a bind would expose CHOIR_HOME, the artifact store or $HOME, or does
            not exist (file and line given).
    """

    from choir.config.heldout import heldout_paths

    sealed = heldout_paths()
    pinned = []
    for i, bind in enumerate(section.binds):
        try:  # pinned to the real path now: a sandbox opening later binds it or refuses
            pinned.append(check_bind(bind, origin=f"sandbox.binds[{i}]", sealed=sealed))
        except ConfigError as exc:
            raise ConfigError(exc.message, path=str(doc.path),
                              line=doc.line_of(("sandbox", "binds", i)),
                              hint="bind the exact folder the step needs") from None
    section = section.model_copy(update={"binds": tuple(pinned)})
    # Resolved here, against the repo itself (verifiers run on a snapshot of the hashed
    # files, which never holds the untracked or ignored .venv), and through symlinks: an
    # executor may replace a symlink in the repo, never the folder a run pinned.
    if section.python and not Path(section.python).is_absolute():
        return section.model_copy(update={"python": os.path.realpath(repo / section.python)})
    if not section.python and not active_venv() and (repo / ".venv" / "pyvenv.cfg").is_file():
        return section.model_copy(update={"python": os.path.realpath(repo / ".venv")})
    return section


def _resource_binds(resources: dict[str, Any], repo: Path, doc: YamlDoc) -> list[str]:
    """The SQLite resources' folders, each checked like a bind (file and line on refusal)."""
    from choir.config.heldout import heldout_paths
    from choir.postconditions.spec import resource_binds

    sealed = heldout_paths()
    given, inside = os.path.abspath(repo), os.path.realpath(repo)
    out = []
    for name, folder in sorted(resource_binds(resources, repo).items()):
        try:
            real = check_bind(folder, origin=f"resource '{name}'", sealed=sealed)
            if os.path.commonpath([os.path.abspath(folder), given]) == given and \
                    os.path.commonpath([real, inside]) != inside:
                # a folder of the repo that leads out of it: a link an executor may have
                # planted (to ~/.config, another repo, a folder of sockets)
                raise ConfigError(f"resource '{name}': its folder {folder} leads outside the "
                                  f"repo ({real})")
            out.append(real)
        except ConfigError as exc:
            raise ConfigError(exc.message, path=str(doc.path),
                              line=doc.line_of(("resources", name)),
                              hint="keep the resource's folder a real folder outside Choir's "
                                   "stores") from None
    return sorted(set(out))


def load_repo_config(repo: Path, *, pinned: str | None = None,
                     committed: tuple[str, bytes] | None = None) -> RepoConfig:
    """Load ``repo/choir.yaml``; every mistake in it is reported at once.

    ``pinned``: the blake3 of the only bytes accepted (``choir mcp`` pins the file when it
    starts; a verification it asks for refuses an edited one before anything runs).
    ``committed``: ``(label, bytes)``, choir.yaml as a commit holds it (``choir verify
    --base``): the file in the tree is not read, and errors name ``choir.yaml@LABEL``.

    Raises:
        ConfigError: the repo does not exist, the file is missing or invalid, or it names no
            verifier at all (no verifier, no assert). Several mistakes raise ConfigErrors.
    """
    repo = repo.expanduser().resolve()
    if not repo.is_dir():
        raise ConfigError(
            "repo folder does not exist", path=str(repo), hint="pass --repo DIR with a real folder"
        )
    path = repo / CONFIG_NAME
    if committed is not None:
        path = repo / f"{CONFIG_NAME}@{committed[0]}"
        doc = load_yaml(path, data=committed[1])
    elif not os.path.lexists(path):
        raise ConfigError("file not found", path=str(path),
                          hint="run 'choir init' in the repo to write one, or pass --repo DIR")
    else:
        doc = load_yaml(path, root=repo, pinned=pinned)  # no link followed, never a FIFO
    if doc.data is None:
        doc = YamlDoc(path=doc.path, data={}, _tree=None)
    if not isinstance(doc.data, dict):
        raise ConfigError(
            "choir.yaml must be a mapping", path=str(path), line=1, hint="start with 'verifiers:'"
        )
    parsed, errors = validation_errors(doc, _ChoirFile)
    errors += _unknown_names(doc)
    verifiers: dict[str, VerifierSpec] = {}
    lines: dict[str, int] = {}
    if parsed is not None and parsed.verification is not None:
        verifiers[PIPELINE] = VerifierSpec(
            name=PIPELINE,
            kind=VerifierKind.PIPELINE,
            steps=parsed.verification.steps,
            timeout_s=parsed.verification.timeout_s,
            parser=parsed.verification.parser,
        )
        lines[PIPELINE] = doc.line_of(("verification",)) or 1
    names = set(_section(doc.data, "verifiers"))
    if "verification" in doc.data:
        names.add(PIPELINE)
    resources, found = _resources(doc)
    errors += found
    for name, raw in _section(doc.data, "verifiers").items():
        if name == PIPELINE and "verification" in doc.data:
            errors.append(ConfigError(
                "verifier name 'pipeline' is taken by the 'verification:' section",
                path=str(path),
                line=doc.line_of(("verifiers", name)),
                hint="rename this verifier",
            ))
            continue
        reserved = _reserved(doc, name, ("verifiers", name))
        if reserved is not None:
            errors.append(reserved)
            continue
        spec, spec_errors = _verifier_spec(doc, name, raw, resources)
        errors += spec_errors
        if spec is not None:
            verifiers[name] = spec
            lines[name] = doc.line_of(("verifiers", name)) or 1
    errors += _decision_methods(doc, names, verifiers, lines, resources)
    for name, resource in resources.items():
        folder = Path(resource.for_harness(repo)["path"]).parent if resource.sqlite else None
        if folder is not None and not folder.is_dir():
            errors.append(ConfigError(
                f"resource '{name}': folder {folder} does not exist", path=str(path),
                line=doc.line_of(("resources", name)),
                hint="create the folder (the sandbox binds it read-only so postconditions "
                     "can read the database)"))
    errors += _schema_form(doc)
    if not names and not errors:
        raise ConfigError(
            "no verifier is configured: nothing could ever be asserted",
            path=str(path),
            line=1,
            hint="add 'verification: {steps: [{name: test, command: pytest -q}]}' or 'verifiers:'",
        )
    if verifiers and names == set(verifiers) and all(
            spec.kind in (VerifierKind.TRACE, VerifierKind.MUTATION)
            for spec in verifiers.values()):  # a mood would plan them alone (F5)
        errors.append(ConfigError(
            f"the allowlist ({', '.join(sorted(verifiers))}) checks no code: a trace verifier "
            "checks the run's own record, so nothing of the tree would be verified",
            path=str(path), line=1,
            hint="add a verifier of the code, e.g. 'unit: {uses: pytest}' under 'verifiers:'"))
    for name, spec in verifiers.items():
        other = spec.lenses.independent
        if other is not None and (other not in names or other == name):
            errors.append(ConfigError(
                f"verifier '{name}': lenses.independent names "
                + ("itself" if other == name else f"unknown verifier '{other}'"),
                path=str(path),
                line=doc.line_of(("verifiers", name, "lenses", "independent")),
                hint="name another verifier of this allowlist: "
                     + ", ".join(sorted(names - {name})),
            ))
    for mood, override in _section(doc.data, "moods").items():
        override = override if isinstance(override, dict) else {}
        errors += _loosened(doc, mood, override, verifiers)
        nothing = _checks_nothing(doc, mood, override.get("verifiers"), verifiers)
        if nothing is not None:
            errors.append(nothing)
        if override.get("verifiers", None) == []:
            errors.append(ConfigError(
                f"mood {mood} names no verifier: nothing could ever be asserted",
                path=str(path), line=doc.line_of(("moods", mood, "verifiers")),
                hint=f"name at least one of: {', '.join(sorted(names))}",
            ))
        for field in ("verifiers", "broaden"):
            listed = override.get(field)
            for i, name in enumerate(listed if isinstance(listed, list) else ()):
                if isinstance(name, str) and name not in names:
                    errors.append(ConfigError(
                        f"mood {mood} names unknown verifier '{name}'",
                        path=str(path),
                        line=doc.line_of(("moods", mood, field, i)),
                        hint=f"use one of: {', '.join(sorted(names))}",
                    ))
    errors += spec_glob_errors(doc, ("spec",))
    ConfigError.raise_all(errors)
    assert parsed is not None  # no error was found, so the file validated
    from choir.config.heldout import load_heldout

    verifiers.update(load_heldout(repo, set(verifiers)))  # the user's, outside the repo
    sandbox = _sandbox_section(parsed.sandbox, repo, doc)
    if resources:
        extra = [b for b in _resource_binds(resources, repo, doc) if b not in sandbox.binds]
        sandbox = sandbox.model_copy(update={"binds": (*sandbox.binds, *extra)})
    return RepoConfig(
        path=str(repo),
        source=str(path),
        verifiers=verifiers,
        models=parsed.models,
        reporter=parsed.reporter,
        moods=parsed.moods,
        sandbox=sandbox,
        max_parallel=parsed.max_parallel,
        lines=lines,
        decisions=parsed.decisions,
        spec=_spec(parsed.spec, verifiers),
    )


def _spec(declared: tuple[str, ...] | None, verifiers: dict[str, VerifierSpec]) -> tuple[str, ...]:
    """The spec globs: the declared ones (else the default), plus what Choir itself runs to
    decide success: ``ALWAYS_SPEC`` and every callable verifier of the allowlist."""
    found = [*(DEFAULT_SPEC if declared is None else declared), *ALWAYS_SPEC]
    for spec in verifiers.values():
        payload = spec.env.get("CHOIR_PC_SPEC")
        ref = json.loads(payload).get("callable") if payload else None
        file = ref.partition(":")[0] if isinstance(ref, str) else ""
        if file.endswith(".py"):
            found.append("/" + file.lstrip("./"))
        elif file and all(part.isidentifier() for part in file.split(".")):
            # ``module:function``: the module as the harness imports it, the tree first on
            # its path (whichever of these the tree holds, in either import root), and the
            # ``__init__.py`` of each package above it, which runs first
            parts = file.split(".")
            for root in ("", "src/"):
                found += [f"/{root}{'/'.join(parts)}{kind}" for kind in (".py", "/")]
                found += [f"/{root}{'/'.join(parts[:i])}/__init__.py"
                          for i in range(1, len(parts))]
    return tuple(dict.fromkeys(found))


def spec_glob_errors(doc: YamlDoc, loc: tuple[str, ...]) -> list[ConfigError]:
    """A ConfigError for every glob under ``loc`` that could name a path outside the repo."""
    listed = doc.data.get(loc[0]) if isinstance(doc.data, dict) else None
    errors = []
    for i, glob in enumerate(listed if isinstance(listed, list) else ()):
        if isinstance(glob, str) and glob.strip("/ ") and not glob.startswith("~") \
                and ".." not in glob.split("/") and "\\" not in glob:
            continue
        errors.append(ConfigError(f"{loc[0]}[{i}]: {glob!r} is not a path inside the repo",
                                  path=str(doc.path), line=doc.line_of((*loc, i)),
                                  hint="write a glob relative to the repo such as "
                                       "'tests/' or 'test_*.py' (no '..', no '~')"))
    return errors


def _decision_budgets(doc: YamlDoc) -> dict[str, int]:
    """Per verifier, the smallest ``verify_timeout_ms`` of the decisions that name it."""
    budgets: dict[str, int] = {}
    for raw in _section(doc.data, "decisions").values():
        rule = _section(raw, "verification")
        ms, methods = rule.get("verify_timeout_ms"), rule.get("methods")
        if not isinstance(ms, int) or isinstance(ms, bool) or ms <= 0:
            continue
        for method in methods if isinstance(methods, list) else ():
            if isinstance(method, str):
                budgets[method] = min(ms, budgets.get(method, ms))
    return budgets


def _resources(doc: YamlDoc) -> tuple[dict[str, Any], list[ConfigError]]:
    """The ``resources:`` postconditions may read, each validated with its line."""
    from choir.postconditions.spec import Resource

    found: dict[str, Any] = {}
    errors: list[ConfigError] = []
    for name, raw in _section(doc.data, "resources").items():
        value, bad = validation_errors(doc, Resource, raw, prefix=("resources", name))
        errors += [ConfigError(e.message, path=e.path, line=e.line,
                               hint="write 'sqlite: PATH', 'postgres: DSN' or 'http: BASE_URL'")
                   for e in bad]
        if value is not None:
            found[name] = value
    return found, errors


def _decision_methods(doc: YamlDoc, names: set[str], verifiers: dict[str, VerifierSpec],
                      lines: dict[str, int], resources: dict[str, Any]) -> list[ConfigError]:
    """Every ``decisions.*.verification.methods`` entry names an allowlisted verifier or a
    ``verifiers/NAME.py`` file of the repo (which then joins the allowlist as a callable)."""
    errors: list[ConfigError] = []
    for decision, raw in _section(doc.data, "decisions").items():
        methods = _section(raw, "verification").get("methods") if isinstance(raw, dict) \
            else None
        for i, method in enumerate(methods if isinstance(methods, list) else ()):
            if not isinstance(method, str) or method in names:
                continue
            loc = ("decisions", decision, "verification", "methods", i)
            if (doc.path.parent / "verifiers" / f"{method}.py").is_file():
                reserved = _reserved(doc, method, loc)
                if reserved is not None:
                    errors.append(reserved)
                    continue
                spec, bad = _verifier_spec(doc, method, {"callable": f"verifiers/{method}.py"},
                                           resources)
                errors += bad
                if spec is not None:
                    names.add(method)
                    verifiers[method] = spec
                    lines[method] = doc.line_of(loc) or 1
                continue
            known = sorted(names)
            close = difflib.get_close_matches(method, known, n=1)
            errors.append(ConfigError(
                f"decision '{decision}' names unknown verification method '{method}'",
                path=str(doc.path), line=doc.line_of(loc),
                hint=(f"did you mean '{close[0]}'? " if close else "")
                + f"name a verifier of 'verifiers:' ({', '.join(known) or 'none'}) or add "
                  f"verifiers/{method}.py with a 'verify(context)' function"))
    return errors


def load_work_item(path: Path, *, part: bool = False) -> WorkItem:
    """Load a work item file; ``repo`` is resolved relative to the file and must exist.

    ``part``: the file is a part a team plan made of a split item (``choir.team.parts``),
    whose id holds the ``~`` of parts; any other file's id may not.

    Raises:
        ConfigError: the file is invalid, the repo is missing, or the executor is incomplete.
    """
    path = path.expanduser().resolve()
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise ConfigError(
            "a work item must be a mapping", path=str(path), line=1, hint="start with 'id: my-item'"
        )
    errors: list[ConfigError] = []
    for key in ("split_of", "focus"):
        if key in doc.data:
            errors.append(ConfigError(f"'{key}' is set by Choir on the parts of a split work "
                                      "item", path=str(path), line=doc.line_of((key,)),
                                      hint=f"remove '{key}:'"))
    data, meta, found = agents.expand_keys(doc, doc.data, ())  # ``uses: claude-code``
    errors += found
    parsed, found = validation_errors(doc, WorkItem, data)
    errors += found + spec_glob_errors(doc, ("may_change_spec",))
    if parsed is None:
        ConfigError.raise_all(errors)
    item: WorkItem = parsed
    if "~" in item.id and not part:
        errors.append(ConfigError(f"work item id '{item.id}' holds '~', which marks the parts "
                                  "of a split work item", path=str(path),
                                  line=doc.line_of(("id",)),
                                  hint="use letters, digits, '.', '_' and '-'"))
    repo, bad = _repo_of(path, item.repo, doc)
    errors += bad
    executor = item.executor
    unknown = _registered(doc, ("executor", "kind"), EXECUTORS, executor.kind,
                          EXECUTORS.names())
    if unknown is not None:
        errors.append(unknown)
    needs: dict[str, Literal["command", "function"]] = {"command": "command", "python": "function",
                                                        "agent": "command"}
    field = needs.get(executor.kind)
    if field is not None and not getattr(executor, field):
        errors.append(ConfigError(
            f"executor kind '{executor.kind}' needs '{field}'",
            path=str(path),
            line=doc.line_of(("executor",)),
            hint=f"add '{field}:' under 'executor:'",
        ))
    if repo is not None:
        errors += agents.problems(doc, ("executor",), executor, repo, meta.get("executor", {}))
        if isinstance(item.escalate_to, ExecutorSpec):
            errors += agents.problems(doc, ("escalate_to",), item.escalate_to, repo,
                                      meta.get("escalate_to", {}))
    if item.decision_type is not None and repo is not None:
        item, found = _decision_required(item, load_repo_config(repo), doc)
        errors += found
    if item.required_verifiers and repo is not None:
        allowlist = load_repo_config(repo).verifiers
        for i, name in enumerate(item.required_verifiers):
            if name not in allowlist:
                errors.append(ConfigError(
                    f"required verifier '{name}' is not in {repo / CONFIG_NAME}",
                    path=str(path), line=doc.line_of(("required_verifiers", i)),
                    hint=f"use one of: {', '.join(sorted(allowlist))}",
                ))
    ConfigError.raise_all(errors)
    assert repo is not None  # else an error was raised
    return item.model_copy(update={"repo": str(repo)})


def _repo_of(path: Path, given: str, doc: YamlDoc) -> tuple[Path | None, list[ConfigError]]:
    """The work item's repo folder, resolved against its file; None, with the ConfigError at
    ``repo:``'s line, when there is none. A NUL byte or a path the system refuses (too long)
    was a ValueError or OSError from ``resolve``, an internal error with a traceback, rather
    than this file's mistake (review 20, F3)."""
    line = doc.line_of(("repo",))
    shown = given if len(given) <= 80 else f"{given[:80]}..."
    hint = "write the repo's folder, relative to the work item file"
    if "\0" in given:
        return None, [ConfigError(f"repo {shown!r} holds a NUL byte, which no path can hold",
                                  path=str(path), line=line, hint=hint)]
    try:
        repo = (path.parent / given).resolve()
        found = repo.is_dir()
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, [ConfigError(f"repo '{shown}' cannot be a folder: {why}",
                                  path=str(path), line=line, hint=hint)]
    if not found:
        return None, [ConfigError(f"repo '{shown}' does not exist (resolved to {repo})",
                                  path=str(path), line=line,
                                  hint="repo is relative to the work item file")]
    return repo, []


def _decision_required(item: WorkItem, config: RepoConfig,
                       doc: YamlDoc) -> tuple[WorkItem, list[ConfigError]]:
    """``item`` with its decision type's methods added to its required verifiers when its
    blast radius is above the type's threshold (docs/postconditions.md, decision types)."""
    from choir.postconditions.decisions import required_methods

    decision = config.decisions.get(item.decision_type or "")
    if decision is None:
        known = sorted(config.decisions)
        close = difflib.get_close_matches(item.decision_type or "", known, n=1)
        return item, [ConfigError(
            f"unknown decision type '{item.decision_type}'", path=str(doc.path),
            line=doc.line_of(("decision_type",)),
            hint=(f"did you mean '{close[0]}'? " if close else "")
            + f"declare it under 'decisions:' in {config.source} (known: "
              f"{', '.join(known) or 'none'})")]
    methods = required_methods(decision, item.blast_radius)
    required = tuple(dict.fromkeys([*item.required_verifiers, *methods]))
    return item.model_copy(update={"required_verifiers": required}), []
