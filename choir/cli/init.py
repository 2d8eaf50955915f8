"""``choir init``: look at a repo, write a commented ``choir.yaml`` that fits, verify it once.

Detection reads only the files a project already has (pyproject.toml, setup.cfg, tox.ini,
package.json) and picks presets for the tools it finds configured or depended on, so the
first ``choir verify`` runs the project's own test and lint tools. The file is validated
before it is written and written in one rename: nothing half-written, and an existing
``choir.yaml`` is never replaced without ``--force``.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import click

from choir.cli._errors import EXIT_OK

_MOODS = ["CALM", "SKEPTICAL", "PARANOID", "BOLD", "CURIOUS"]
_PY_TOOLS = ("pytest", "ruff", "mypy", "bandit")
_MYPY_TARGET_KEYS = ("files", "packages", "modules")
# mypy's own flags of the preset, without its `.` target: used when the project's mypy
# config names the targets, since a target on the command line replaces the config's.
_MYPY_OWN_TARGETS = ("python3 -m mypy --cache-dir=$CHOIR_OUT/mypy-cache --no-error-summary "
                     "--show-error-codes --no-color-output --no-pretty")
_WHY = {"pytest": "runs your tests; JUnit XML goes to $CHOIR_OUT, cache off",
        "ruff": "lint as JSON, no cache written into the repo",
        "mypy": "type checks; its cache lives under $CHOIR_OUT",
        "bandit": "security scan as SARIF (needs bandit[sarif])"}


@dataclass
class Detected:
    """What ``detect`` found: presets by tool, npm scripts, and why (shown in the file);
    ``skipped``: tools the project configures but its interpreter cannot run, and why;
    ``mypy_targets``: mypy's own config names its targets (files/packages/modules)."""

    presets: list[str] = field(default_factory=list)
    npm_scripts: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    mypy_targets: bool = False

    def add(self, tool: str, reason: str) -> None:
        if tool not in self.presets:
            self.presets.append(tool)
            self.reasons[tool] = reason


def _mentions(names: list[str], tool: str) -> bool:
    pattern = re.compile(rf"^\s*{re.escape(tool)}(?![\w-])", re.IGNORECASE)
    return any(pattern.match(n) for n in names)


DETECT_MAX = 1 << 20  # a project file larger than this is not read for detection


def _text(repo: Path, name: str) -> str | None:
    """A project file of ``repo`` as text, for detection only: opened from the repo without
    following a link (a ``pyproject.toml`` linked outside the repo is not this repo's), at
    most ``DETECT_MAX`` bytes; None when it is absent, a link, not a regular file, larger,
    or not UTF-8 (detection then does without it)."""
    from choir._core import fsopen

    try:
        data = fsopen.read_bytes(repo, name, DETECT_MAX + 1)
    except OSError:
        return None
    if len(data) > DETECT_MAX:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _table(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def _items(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _pyproject(repo: Path, found: Detected) -> None:
    import tomllib

    text = _text(repo, "pyproject.toml")
    if text is None:
        return
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):
        return  # not ours to judge; other files may still tell
    # every value is checked for its type: a well-formed file may hold anything
    tool, project = _table(data.get("tool")), _table(data.get("project"))
    deps: list[str] = [str(d) for d in _items(project.get("dependencies"))]
    for group in _table(project.get("optional-dependencies")).values():
        deps += [str(d) for d in _items(group)]
    for group in _table(data.get("dependency-groups")).values():
        deps += [str(d) for d in _items(group) if isinstance(d, str)]
    poetry = _table(tool.get("poetry"))
    deps += [str(k) for k in _table(poetry.get("dev-dependencies"))]
    for group in _table(poetry.get("group")).values():
        deps += [str(k) for k in _table(_table(group).get("dependencies"))]
    mypy = tool.get("mypy")
    if isinstance(mypy, dict) and any(mypy.get(k) for k in _MYPY_TARGET_KEYS):
        found.mypy_targets = True
    for name in _PY_TOOLS:
        if name in tool:
            found.add(name, f"pyproject.toml has [tool.{name}]")
        elif _mentions(deps, name):
            found.add(name, f"pyproject.toml depends on {name}")


def _ini(repo: Path, name: str, sections: dict[str, str], found: Detected) -> None:
    text = _text(repo, name)
    if text is None:
        return
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
    except configparser.Error:
        return
    for section, tool in sections.items():
        if parser.has_section(section):
            found.add(tool, f"{name} has [{section}]")
            if tool == "mypy" and any(parser.get(section, k, fallback="").strip()
                                      for k in _MYPY_TARGET_KEYS):
                found.mypy_targets = True
    if name == "tox.ini":
        for section in parser.sections():
            deps = parser.get(section, "deps", fallback="").splitlines()
            for tool in _PY_TOOLS:
                if _mentions(deps, tool):
                    found.add(tool, f"tox.ini [{section}] depends on {tool}")


def _package_json(repo: Path, found: Detected) -> None:
    text = _text(repo, "package.json")
    if text is None:
        return
    try:
        scripts = _table(json.loads(text)).get("scripts") or {}
    except (ValueError, RecursionError):
        return
    for script in ("lint", "typecheck", "build", "test"):
        if isinstance(scripts, dict) and isinstance(scripts.get(script), str):
            found.npm_scripts.append(script)


def _has_tests(repo: Path) -> bool:
    """A ``test_*.py`` at the top or under ``tests/``, found without following a link (a
    ``tests`` linked to ``/`` walked the whole file system)."""
    from choir._core import fsopen

    try:
        with os.scandir(repo) as top:
            if any(e.name.startswith("test_") and e.name.endswith(".py") and
                   e.is_file(follow_symlinks=False) for e in top):
                return True
        if not stat.S_ISDIR(os.lstat(repo / "tests").st_mode):
            return False
        for entry in fsopen.walk(repo / "tests", max_depth=64):
            name = entry.rel.rsplit("/", 1)[-1]
            if name.startswith("test_") and name.endswith(".py") and \
                    stat.S_ISREG(entry.st.st_mode):
                return True
    except OSError:
        return False
    return False


def detect(repo: Path) -> Detected:
    """The presets and npm scripts that fit ``repo``; pytest also when test files exist."""
    found = Detected()
    _pyproject(repo, found)
    _ini(repo, "setup.cfg", {"tool:pytest": "pytest", "mypy": "mypy"}, found)
    _ini(repo, "tox.ini", {"pytest": "pytest", "mypy": "mypy"}, found)
    _ini(repo, "pytest.ini", {"pytest": "pytest"}, found)
    _ini(repo, "mypy.ini", {"mypy": "mypy"}, found)
    _ini(repo, ".mypy.ini", {"mypy": "mypy"}, found)
    _package_json(repo, found)
    if "pytest" not in found.presets and _has_tests(repo):
        found.add("pytest", "test_*.py files found")
    found.presets.sort(key=_PY_TOOLS.index)
    return found


def _site_dirs(repo: Path, python: Path | None) -> tuple[str, list[Path]]:
    """The interpreter every step will run (the sandbox's own choice) and the folders its
    imports come from, read from the file system: the project's interpreter is the
    project's code, and ``choir init`` never runs it on the host."""
    from choir.sandbox._toolchain import choose

    chain = choose(repo, str(python) if python else None)
    roots: list[Path] = []
    include_base = chain.venv is None
    if chain.venv is not None:
        roots.append(Path(chain.venv))
        try:
            cfg = (Path(chain.venv) / "pyvenv.cfg").read_text(encoding="utf-8")
        except OSError:
            cfg = ""
        include_base = bool(re.search(r"^\s*include-system-site-packages\s*=\s*true",
                                      cfg, re.MULTILINE | re.IGNORECASE))
    if include_base:
        roots += [Path(p).parent for p in chain.path_head if p != f"{chain.venv}/bin"]
    dirs: list[Path] = []
    for root in roots:
        dirs += sorted(root.glob("lib/python3*/site-packages"))
        dirs += sorted(root.glob("lib/python3*/dist-packages"))
        if include_base and str(root) in ("/usr", "/usr/local"):
            dirs.append(root / "lib/python3/dist-packages")
    where = chain.venv or (roots[0] if roots else "the system Python")
    return str(where), [d for d in dirs if d.is_dir()]


def _has_module(dirs: list[Path], name: str) -> bool:
    return any((d / name / "__init__.py").is_file() or (d / name / "__main__.py").is_file()
               or any(d.glob(f"{name}-*.dist-info")) for d in dirs)


def unignored_venvs(repo: Path) -> list[str]:
    """Top-level virtualenvs that git would hash into the tree (not ignored): their
    ``bin/python`` links out of the repo, so verifying would refuse the tree."""
    from choir.evidence.git import locate

    venvs = sorted(p.parent.name for p in repo.glob("*/pyvenv.cfg"))
    found = locate(repo) if venvs else None
    if found is None:
        return []
    listed = found.run("ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                       *(f"{name}/pyvenv.cfg" for name in venvs)) or b""
    return sorted({entry.split("/", 1)[0] for entry in listed.decode(errors="replace")
                   .split("\0") if entry})


def keep_runnable(found: Detected, repo: Path, python: Path | None) -> None:
    """Drop the presets whose tool the project's interpreter does not have, saying why: a
    verifier that cannot run is INCONCLUSIVE on every round, and PARANOID halts on it."""
    where, dirs = _site_dirs(repo, python)
    for name in list(found.presets):
        if not _has_module(dirs, name):
            found.presets.remove(name)
            found.skipped[name] = (f"{found.reasons.pop(name)}, but {name} is not installed "
                                   f"for the project's interpreter ({where}); install it "
                                   "there and run `choir init --force`")


def render(found: Detected, python: Path | None = None) -> str:
    """The commented ``choir.yaml`` text for what was found (``python``: the interpreter the
    checks run with, written as ``sandbox.python``)."""
    out = ["# choir.yaml: written by `choir init`. Only the verifiers below may ever run.",
           "# `uses: NAME` starts from a preset; a field written beside it replaces the",
           "# preset's field (e.g. `timeout_s: 120`, or `steps:` to replace the command).",
           "# Presets run `python3 -m TOOL` with the project's interpreter: `sandbox.python`,",
           "# else an active venv, else the repo's .venv, else the system Python. Install the",
           "# tools there.", ""]
    if found.npm_scripts:
        out += ["# npm: the scripts package.json defines, in order; stops at the first failure.",
                "verification:", "  steps:"]
        for script in found.npm_scripts:
            command = "npm test" if script == "test" else f"npm run {script}"
            out += [f"    - name: {script}", f"      command: {command}"]
        out += ["  timeout_s: 900", ""]
    if found.presets:
        out.append("verifiers:")
        for name in found.presets:
            out += [f"  # {_WHY[name]}; chosen because {found.reasons[name]}",
                    f"  {name}:", f"    uses: {name}"]
            if name == "mypy" and found.mypy_targets:
                out += ["    # your mypy config names the targets: no `.` on the command line",
                        "    steps:", "      - name: mypy",
                        f"        command: {_MYPY_OWN_TARGETS}"]
        out.append("")
    for name, why in found.skipped.items():
        out.append(f"# not written: {name} ({why})")
    if found.skipped:
        out.append("")
    if python is not None:
        out += ["# The interpreter (and its installed tools) every step runs with.",
                "sandbox:", f"  python: {json.dumps(str(python))}", ""]
    out += ["# Moods pick verifiers by kind: CALM runs unit tests, SKEPTICAL adds lint and",
            "# type checks, PARANOID adds security scans. `choir verify --mood SKEPTICAL`."]
    return "\n".join(out) + "\n"


def write_config(repo: Path, text: str, *, force: bool) -> Path:
    """Validate ``text`` as a choir.yaml, then put it in place with one rename.

    Raises:
        ConfigError: the file exists and ``force`` is false (it is left untouched).
    """
    from choir.config import CONFIG_NAME, load_repo_config
    from choir.exceptions import ConfigError

    target = repo / CONFIG_NAME
    if target.exists() and not force:
        raise ConfigError("already exists; choir init leaves it as it is", path=str(target),
                          hint="edit it, or run `choir init --force` to replace it")
    if target.is_dir() and not target.is_symlink():  # --force replaces a file, not a folder
        raise ConfigError("is a folder; choir init replaces only a file", path=str(target),
                          hint="remove or rename the folder, then run `choir init` again")
    with tempfile.TemporaryDirectory(prefix="choir-init-") as scratch:
        (Path(scratch) / CONFIG_NAME).write_text(text, encoding="utf-8")
        load_repo_config(Path(scratch))  # a generated file that does not load is our bug
    fd, tmp = tempfile.mkstemp(prefix=".choir.yaml.", dir=repo)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


@click.command()
@click.option("--repo", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="The repo to inspect; choir.yaml is written at its root.")
@click.option("--force", is_flag=True, help="Replace an existing choir.yaml.")
@click.option("--no-verify", is_flag=True, help="Write the file only; do not verify once.")
@click.option("--mood", type=click.Choice(_MOODS, case_sensitive=False), default=None,
              help="Mood of the first verification (default CALM).")
@click.option("--sandbox", "sandbox_name", default=None,
              help="docker | bwrap | local | auto for the first verification.")
@click.option("--python", type=click.Path(path_type=Path), default=None,
              help="The project's interpreter, with its tools (written as sandbox.python).")
def init(repo: Path, force: bool, no_verify: bool, mood: str | None,
         sandbox_name: str | None, python: Path | None) -> int:
    """Write a commented choir.yaml that fits this repo, then verify it once."""
    from choir.exceptions import UserError

    repo = repo.expanduser().resolve()
    if not repo.is_dir():
        raise UserError(f"{repo}: repo folder does not exist\n  fix: pass --repo DIR")
    exposed = unignored_venvs(repo)
    if exposed:
        raise UserError(
            f"{repo}: {', '.join(n + '/' for n in exposed)} is a virtualenv that git does not "
            "ignore, so it would be part of the tree to verify (its interpreter links point "
            "outside the repo, which verification refuses)\n"
            f"  fix: add {', '.join(repr(n + '/') for n in exposed)} to .gitignore, then run "
            "`choir init` again (nothing was written)")
    found = detect(repo)
    if python is not None and not python.is_absolute():
        python = python.absolute()
    keep_runnable(found, repo, python)
    for name, why in found.skipped.items():
        click.echo(f"skipped {name}: {why}", err=True)
    if not found.presets and not found.npm_scripts:
        raise UserError(
            f"{repo}: found no tests or tools to verify with (looked at pyproject.toml, "
            "setup.cfg, tox.ini, pytest.ini, package.json, test_*.py)\n"
            "  fix: write choir.yaml by hand, e.g. 'verifiers: {unit: {uses: pytest}}'")
    path = write_config(repo, render(found, python), force=force)
    chosen = ", ".join(found.presets + [f"npm {s}" for s in found.npm_scripts])
    click.echo(f"wrote {path} ({chosen})", err=True)
    if no_verify:
        return EXIT_OK
    from choir.cli.verify import run_verify

    code = run_verify(repo, mood=mood, sandbox_name=sandbox_name, as_json=False)
    if code != EXIT_OK:
        click.echo("choir.yaml is written; the first verification did not pass: fix the code, "
                   "or edit choir.yaml, then run `choir verify`", err=True)
    return code
