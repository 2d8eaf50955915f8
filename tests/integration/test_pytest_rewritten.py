"""The pytest preset's rewritten test modules from Choir's cache, in a real bubblewrap step.

A step of the pytest preset gets a read-only folder of its tree's test modules rewritten by
Choir's own pytest (``choir.sandbox.rewritten``), linked from a cache the warm service
fills. The attack: a step poisons what it was given (the links share the cache's files), so
that a later tree whose test module has the same bytes runs the poisoned code and passes
with a bug in it. The folder is a read-only bind: every write is refused, and the later
tree fails. (Made writable by hand, the same test passes the buggy tree: it proves
something.) The same for the plain modules' compiled code: a step whose tree has a bug
poisons the code it was given for the buggy module, so that a later tree with the same bug
passes. And through a real ``choir serve``: its second request's step loads what the
first one's worker made.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

from choir._core.paths import artifact_dir
from choir.app.verify import averify_tree
from choir.models import Mood
from choir.sandbox import rewritten
from tests.serving import choir, start_service, stop_service

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
              pytest.mark.skipif(rewritten.tail() is None,
                                 reason="this pytest keeps no checked-hash rewrites")]

CHOIR_YAML = textwrap.dedent("""\
    sandbox: {{backend: bwrap, python: {venv}}}
    verifiers:
      unit: {{uses: pytest, env: {{PYTEST_DEBUG: "1"}}}}
    moods:
      CALM: {{verifiers: [unit]}}
    """)
PYTEST_PACKAGES = ("_pytest", "pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")
TEST = "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def poison(module: str, source: str) -> str:
    """The tree's conftest, run in the step: it tries every way to change what it was given
    for ``module`` (its file's name starts so) to the code of ``source``."""
    return textwrap.dedent("""\
        import marshal, os, sys
        sys.path.insert(0, os.getcwd())
        folder = os.environ.get("CHOIR_PYTEST_PYC", "")
        said = []
        def attempt(name, act):
            try:
                act()
                said.append(name + ": done")
            except OSError as exc:
                said.append(f"{name}: refused ({exc.strerror})")
        given = [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs
                 if f.startswith(MODULE + ".")]
        if given:
            with open(given[0], "rb") as fh:
                head = fh.read(16)
            code = compile(SOURCE, MODULE + ".py", "exec")
            def overwrite():
                with open(given[0], "r+b") as fh:
                    fh.write(head + marshal.dumps(code))
            def replace():
                with open(given[0] + ".new", "wb") as fh:
                    fh.write(head + marshal.dumps(code))
                os.replace(given[0] + ".new", given[0])
            attempt("overwrite", overwrite)
            attempt("replace", replace)
            attempt("chmod", lambda: os.chmod(given[0], 0o666))
            attempt("unlink", lambda: os.unlink(given[0]))
            cache = os.path.join(os.path.dirname(os.path.dirname(folder)),
                                 os.path.basename(given[0]).split(".", 1)[1])
            attempt("list the cache", lambda: os.listdir(cache))
        with open(os.path.join(os.environ["CHOIR_OUT"], "probe.txt"), "w") as fh:
            fh.write(f"given={len(given)}\\n" + "\\n".join(said) + "\\n")
        """).replace("MODULE", repr(module)).replace("SOURCE", repr(source))


# the step's command spelled out to add ``-s``: the import system's trace (``PYTHONVERBOSE``)
# says which compiled files the step took code from, and pytest must not capture it
COMPILED_YAML = textwrap.dedent("""\
    sandbox: {{backend: bwrap, python: {venv}}}
    verifiers:
      unit:
        uses: pytest
        env: {{PYTHONVERBOSE: "1"}}
        steps:
          - name: pytest
            command: python3 -c "$CHOIR_PYTEST" -q -s -p no:cacheprovider
    moods:
      CALM: {{verifiers: [unit]}}
    """)
BUGGY = "def add(a, b):\n    return a - b\n"



@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project venv whose pytest is the one Choir imports (the steps' pytest must be it
    for a rewrite to be used): the host's Python, this venv's pytest packages linked in."""
    made = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(made)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    into = next(made.glob("lib/python*/site-packages"))
    for name in PYTEST_PACKAGES:
        if (ours / name).is_dir():
            shutil.copytree(ours / name, into / name, copy_function=_link)
        else:
            _link(str(ours / name), str(into / name))
    return made


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def repo_of(root: Path, calc: str, conftest: str | None, venv: Path,
            config: str = CHOIR_YAML) -> Path:
    repo = root / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(calc)
    (repo / "tests" / "test_calc.py").write_text(TEST)
    (repo / "choir.yaml").write_text(config.format(venv=venv))
    if conftest is not None:
        (repo / "tests" / "conftest.py").write_text(conftest)
    return repo


def test_a_step_cannot_poison_the_rewrites_a_later_tree_is_given(
        tmp_path: Path, choir_home: Path, venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rewritten, "_filling", [True])  # as a warm service's worker
    monkeypatch.setattr(rewritten, "_pending", {})
    monkeypatch.setattr(rewritten, "_kept", [0])
    good = "def add(a, b):\n    return a + b\n"
    hostile = repo_of(tmp_path / "one", good, poison("test_calc", "def test_add():\n    pass\n"),
                      venv)
    assert asyncio.run(averify_tree(hostile, mood=Mood.CALM)).passed
    assert rewritten.fill() == 4  # the test module, the conftest, calc.py, the wrapper
    assert asyncio.run(averify_tree(hostile, mood=Mood.CALM)).passed  # the attack's round
    probes = sorted(artifact_dir().glob("runs/*/out/probe.txt"),
                    key=lambda p: p.stat().st_mtime)
    said = probes[-1].read_text().splitlines()
    assert said[0] == "given=1", said  # the step was given the poisoned module's rewrite
    assert all("refused" in line for line in said[1:]) and len(said) == 6, said
    buggy = repo_of(tmp_path / "two", "def add(a, b):\n    return a - b\n", None, venv)
    outcome = asyncio.run(averify_tree(buggy, mood=Mood.CALM))
    assert not outcome.passed, "a poisoned rewrite passed a buggy tree"
    logs = sorted(artifact_dir().glob("runs/*-unit-0/logs/step-01-pytest.log"),
                  key=lambda p: p.stat().st_mtime)
    step = logs[-1].read_text()
    assert "found cached rewritten pyc for" in step  # the cache was used, unpoisoned
    assert "assert -1 == 5" in step


def test_a_step_cannot_poison_the_code_a_later_tree_with_its_bug_runs(
        tmp_path: Path, choir_home: Path, venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rewritten, "_filling", [True])  # as a warm service's worker
    monkeypatch.setattr(rewritten, "_pending", {})
    monkeypatch.setattr(rewritten, "_kept", [0])
    right = "def add(a, b):\n    return a + b\n"  # for the buggy tree's calc.py
    hostile = repo_of(tmp_path / "one", BUGGY, poison("calc", right), venv, COMPILED_YAML)
    assert not asyncio.run(averify_tree(hostile, mood=Mood.CALM)).passed  # the bug, found
    assert rewritten.fill() == 4  # calc.py's code, the test module's, the conftest's and
    # the preset's wrapper
    assert not asyncio.run(averify_tree(hostile, mood=Mood.CALM)).passed  # the attack's round
    probes = sorted(artifact_dir().glob("runs/*/out/probe.txt"),
                    key=lambda p: p.stat().st_mtime)
    said = probes[-1].read_text().splitlines()
    assert said[0] == "given=1", said  # the step was given the buggy module's code
    assert all("refused" in line for line in said[1:]) and len(said) == 6, said
    later = repo_of(tmp_path / "two", BUGGY, None, venv, COMPILED_YAML)
    outcome = asyncio.run(averify_tree(later, mood=Mood.CALM))
    assert not outcome.passed, "poisoned code passed a buggy tree"
    logs = sorted(artifact_dir().glob("runs/*-unit-0/logs/step-01-pytest.log"),
                  key=lambda p: p.stat().st_mtime)
    step = logs[-1].read_text()
    assert f"/calc{rewritten.compiled()} matches " in step  # the cache was used, unpoisoned
    assert "assert -1 == 5" in step


@pytest.mark.slow  # a service's start and two cold clients: the attack above runs always
def test_a_warm_services_next_step_loads_what_its_last_request_made(
        tmp_path: Path, choir_home: Path, venv: Path) -> None:
    repo = repo_of(tmp_path, "def add(a, b):\n    return a - b\n", None, venv)
    pid = start_service()
    try:
        for _ in range(2):
            proc = choir("verify", "--mood", "CALM", cwd=repo, serve="require")
            assert proc.returncode == 1, proc.stdout + proc.stderr  # the bug, found both times
            # the worker makes them once its client has its answer: the next request after
            deadline = time.monotonic() + 30
            while not [p for p in rewritten.root().glob("*/*") if p.parent.name != "steps"] \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        stop_service(pid)
    logs = sorted(artifact_dir().glob("runs/*-unit-0/logs/step-01-pytest.log"),
                  key=lambda p: p.stat().st_mtime)
    first, second = (p.read_text() for p in logs[-2:])
    assert "found cached rewritten pyc for" not in first
    assert "found cached rewritten pyc for" in second and "test_calc.py" in second
    assert "assert -1 == 5" in first and "assert -1 == 5" in second
