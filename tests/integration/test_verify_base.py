"""``choir verify --base REF``: a change is verified with its base's choir.yaml and checks.

Each attack is a pull request's: it breaks ``add`` and then makes the check pass by editing
what the check is made of (the test, choir.yaml, a planted conftest.py, a new test module
that patches the code at import). Each is shown passing on the tree's own checks (a bare
``choir verify``, which is what CI without a base runs), then failing against the base.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_verify_cli import CALC_BUG, CALC_OK, make_repo, run, sandbox_name
from tests.workitems import NO_PLUGINS, STEP_PY

ALWAYS_PASS = textwrap.dedent("""\
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        report = outcome.get_result()
        report.outcome = "passed"
    """)
PATCH_AT_IMPORT = textwrap.dedent("""\
    import calc

    calc.add = lambda a, b: a + b

    def test_patched():
        assert calc.add(1, 1) == 2
    """)

# patches pytest's reports to passed, whether pytest imported them already or not
REPORTS_PASS = textwrap.dedent("""\
    import importlib.util, sys

    def _patch(module):
        made = module.TestReport.from_item_and_call.__func__
        def passed(cls, item, call):
            report = made(cls, item, call)
            report.outcome, report.longrepr = "passed", None
            return report
        module.TestReport.from_item_and_call = classmethod(passed)

    if "_pytest.reports" in sys.modules:
        _patch(sys.modules["_pytest.reports"])
    else:
        class _Hook:
            def find_spec(self, name, path, target=None):
                if name != "_pytest.reports":
                    return None
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec(name)
                run = spec.loader.exec_module
                def exec_module(module):
                    run(module)
                    _patch(module)
                spec.loader.exec_module = exec_module
                return spec
        sys.meta_path.insert(0, _Hook())
    """)
# a fake pytest that runs the real one, hooked, with itself off the path
FAKE_PYTEST = REPORTS_PASS + textwrap.dedent("""\
    import os
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != here]
    sys.modules.pop("pytest", None)
    import pytest
    sys.path.append(here)
    raise SystemExit(pytest.console_main())
    """)
FAKE_XML = REPORTS_PASS + textwrap.dedent("""\
    import os
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    del sys.modules["xml"]
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import xml as _real
    sys.path[:] = saved
    sys.modules["xml"] = _real
    """)
# a package named like one pytest imports as it runs: it patches the reports, then hands
# the real package back
FAKE_PYGMENTS = FAKE_XML.replace('"xml"', '"pygments"').replace("import xml as",
                                                                "import pygments as")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repo whose main holds the right ``add`` and its test, on branch ``pr``."""
    repo = make_repo(tmp_path_factory.mktemp("base") / "repo", CALC_OK)
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "pr")
    return repo


@pytest.fixture
def repo(template: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(template, copy, symlinks=True)
    return copy


def commit(repo: Path, files: dict[str, str], message: str = "pr") -> None:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


def verify(repo: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    proc = run("verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name(), *extra)
    assert proc.returncode in (0, 1, 4), proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def results(contract: dict[str, Any]) -> dict[str, str]:
    return {f"{t['verifier']}#{t['replica']}": t["result"] for t in contract["threads"]}


def test_a_weakened_test_passes_on_the_trees_checks_and_is_held_against_the_base(
        repo: Path) -> None:
    commit(repo, {"calc.py": CALC_BUG, "test_calc.py": "def test_add():\n    assert True\n"})
    code, own = verify(repo)
    assert code == 0 and own["status"] == "PASS"  # the attack, on the tree's own checks
    code, against = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 1 and against["status"] == against["verdict"] == "FAIL"
    base = against["base"]
    assert base["ref"] == "main" and base["commit"] == git(repo, "rev-parse", "main").strip()
    assert base["modified"] == ["test_calc.py"] and base["held"] == ["test_calc.py"]
    assert base["blocked"].startswith("held for a person") and not base["approved"]
    assert results(against)["unit#0"] == "FAIL"  # the base's test ran on the change
    assert against["claim"]["asserted"] is None
    gate = run("gate", "ci", "--repo", str(repo))
    assert gate.returncode == 1, gate.stdout + gate.stderr


def test_a_choir_yaml_that_skips_the_tests_is_never_read_against_the_base(repo: Path) -> None:
    noop = ("verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n"
            "      - {name: ok, command: 'true'}\n")
    commit(repo, {"calc.py": CALC_BUG, "choir.yaml": noop})
    code, own = verify(repo)
    assert code == 0 and own["plan"] == ["unit"]
    code, against = verify(repo, "--base", "main")
    assert code == 1
    assert results(against)["unit#0"] == "FAIL"
    commands = [c["command"] for c in against["manifest"]["commands_executed"]]
    assert len(commands) == 1 and "-m pytest" in commands[0]  # the base's step
    assert against["base"]["modified"] == ["choir.yaml"]


def test_a_planted_conftest_is_held_and_no_check_sees_it_unless_a_person_approves(
        repo: Path) -> None:
    """A new ``conftest.py`` changes how every check runs, so it is never an addition beside
    the base's checks: unapproved, the base's checks run without it and the tree is held (a
    review found "refused, approved or not" left a pull request adding a test folder's
    conftest to be merged by hand); the person is shown it whole, and once approved it runs,
    as an approved edit of a test does."""
    commit(repo, {"calc.py": CALC_BUG, "conftest.py": ALWAYS_PASS})
    code, own = verify(repo)
    assert code == 0
    code, against = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 1
    base = against["base"]
    assert base["held"] == ["conftest.py"] and base["refused"] == [] and base["added"] == []
    assert base["blocked"].startswith("held for a person") and not base["approved"]
    assert base["blocked"].endswith("1 path(s): conftest.py")
    assert results(against) == {"unit#0": "FAIL"}  # the base's test, without the conftest
    assert against["claim"]["asserted"] is None
    diff = _artifact(base["diff"])
    assert "--- /dev/null\n+++ b/conftest.py\n" in diff and 'report.outcome = "passed"' in diff
    code, approved = verify(repo, "--base", "main", "--approve-spec-change")
    assert code == 0 and approved["base"]["approved"] and approved["base"]["blocked"] is None
    assert approved["base"]["held"] == ["conftest.py"]


# a new test folder whose test needs the fixture its new conftest.py gives
NEW_FOLDER = {"calc.py": CALC_OK + "\n\ndef mul(a, b):\n    return a * b\n",
              "more/conftest.py": "import pytest\n\n@pytest.fixture\ndef two():\n"
                                  "    return 2\n",
              "more/test_mul.py": "from calc import mul\n\ndef test_mul(two):\n"
                                  "    assert mul(two, 3) == 6\n"}


def test_a_conftest_for_a_new_test_folder_is_verified_once_approved(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commit(repo, NEW_FOLDER)
    code, held = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 1 and held["base"]["held"] == ["more/conftest.py"]
    assert held["base"]["added"] == ["more/test_mul.py"]
    assert results(held)["unit#1000"] == "FAIL"  # the new test, without its fixture
    # a CI job's home is its own: the held job's FAIL (of a view without the fixture) is not
    # in the approved job's, where it would make the same tree's PASS disagreement (FLAKY)
    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "approved-job"))
    code, approved = verify(repo, "--base", "main", "--approve-spec-change", "--claim", "ci")
    assert code == 0, approved["summary"]
    assert results(approved) == {"unit#0": "PASS", "unit#1000": "PASS"}
    assert approved["claim"]["asserted"]
    assert run("gate", "ci", "--repo", str(repo)).returncode == 0


def test_a_module_beside_a_new_conftest_never_stands_in_for_the_code(repo: Path) -> None:
    """Review 16g: a new ``more/conftest.py`` (a harmless fixture, all the person is shown)
    puts ``more/`` first on the tests' path once approved, so a ``more/calc.py`` beside it
    was the ``calc`` the base's test imported: PASS, ASSERT, the gate open, with ``add``
    broken. The new conftest's folder is a tests' folder for the shadow check, so the
    module is refused, approved or not."""
    commit(repo, {"calc.py": CALC_BUG, "more/conftest.py": NEW_FOLDER["more/conftest.py"],
                  "more/calc.py": CALC_OK})
    code, against = verify(repo, "--base", "main", "--approve-spec-change", "--claim", "ci")
    assert code == 1, against["summary"]
    assert against["base"]["refused"] == ["more/calc.py"]
    assert against["base"]["blocked"].startswith("refused, approved or not")
    assert against["claim"]["asserted"] is None


def test_a_pass_that_asserts_nothing_says_why(repo: Path) -> None:
    """The same tree held (its new test FAILed without the fixture the held conftest gives)
    and then approved (PASS) in one home: the PASS is disagreement with the FAIL on record
    for that very tree, so no ASSERT; the command said "the session did not PASS"."""
    commit(repo, NEW_FOLDER)
    code, held = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 1 and held["claim"]["reason"].startswith("spec held for a person")
    proc = run("verify", "--repo", str(repo), "--sandbox", sandbox_name(), "--base", "main",
               "--approve-spec-change", "--claim", "ci")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "claim ci: not ASSERTed: an attested FAIL of unit on this very tree" in \
        " ".join(proc.stdout.split())


@pytest.mark.parametrize("name", ["pytest.py", "sitecustomize.pyc", "test_calc/__init__.py",
                                  "sitecustomize.py", "hook.pth"])
def test_a_new_module_standing_in_for_the_harness_is_refused_even_approved(
        repo: Path, name: str) -> None:
    commit(repo, {"calc.py": CALC_BUG, name: "raise SystemExit(0)\n"})
    code, against = verify(repo, "--base", "main", "--approve-spec-change")
    assert code == 1
    assert name in against["base"]["refused"] and not against["base"]["held"]
    assert against["base"]["blocked"].startswith("refused, approved or not")


def _artifact(digest: str) -> str:
    from choir.evidence.artifacts import ArtifactStore
    return ArtifactStore().read_bytes(digest).decode()


def test_a_new_test_adds_evidence_beside_the_base_checks(repo: Path) -> None:
    commit(repo, {"calc.py": CALC_OK + "\n\ndef mul(a, b):\n    return a * b\n",
                  "test_mul.py": "from calc import mul\n\ndef test_mul():\n"
                                 "    assert mul(2, 3) == 6\n"})
    code, against = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 0, against["summary"]
    assert against["base"]["added"] == ["test_mul.py"] and against["base"]["blocked"] is None
    assert results(against) == {"unit#0": "PASS", "unit#1000": "PASS"}
    assert against["claim"]["asserted"]
    assert run("gate", "ci", "--repo", str(repo)).returncode == 0


def test_a_new_test_cannot_make_a_failing_base_check_pass(repo: Path) -> None:
    commit(repo, {"calc.py": CALC_BUG, "test_0patch.py": PATCH_AT_IMPORT})
    code, own = verify(repo)
    assert code == 0  # the patch, imported before the base's test module, hides the bug
    code, against = verify(repo, "--base", "main")
    assert code == 1
    assert against["base"]["added"] == ["test_0patch.py"]
    found = results(against)
    assert found["unit#0"] == "FAIL" and found["unit#1000"] == "PASS"


def test_an_approved_change_to_a_check_is_verified_with_the_trees_version(repo: Path) -> None:
    commit(repo, {"calc.py": "def add(a, b):\n    return a + b + 0\n",
                  "test_calc.py": "from calc import add\n\ndef test_add():\n"
                                  "    assert add(2, 2) == 4\n"})
    code, held = verify(repo, "--base", "main")
    assert code == 1 and held["base"]["held"] == ["test_calc.py"]
    assert results(held)["unit#0"] == "PASS"  # the base's test passes too, but it is held
    # ... and its in-toto test results say so: found by a review, they said PASSED
    bundle = repo.parent / "held.jsonl"
    made = run("attest", "bundle", "--session", held["run_id"], "--out", str(bundle))
    assert made.returncode == 0, made.stderr
    statements = [json.loads(base64.b64decode(json.loads(line)["payload"]))
                  for line in bundle.read_text().splitlines()]
    tests = [s["predicate"] for s in statements if s["predicateType"].endswith("/v0.1")]
    assert tests and all(t["result"] == "FAILED" and "choir:spec-change" in t["failedTests"]
                         for t in tests)
    assert all(any(c["name"] == "choir:spec" for c in t["configuration"]) for t in tests)
    code, approved = verify(repo, "--base", "main", "--approve-spec-change", "--claim", "ci")
    assert code == 0, approved["summary"]
    assert approved["base"]["approved"] and approved["base"]["blocked"] is None
    assert approved["base"]["spec_hash"] != held["base"]["spec_hash"]  # the tree's test, pinned
    assert approved["claim"]["asserted"]
    audit = run("audit")
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_a_base_the_checkout_lacks_is_a_clear_exit_2(repo: Path) -> None:
    proc = run("verify", "--repo", str(repo), "--base", "0" * 40)
    assert proc.returncode == 2
    assert "no such commit" in proc.stderr and "fetch-depth: 0" in proc.stderr
    proc = run("verify", "--repo", str(repo), "--approve-spec-change")
    assert proc.returncode == 2 and "--base" in proc.stderr


def test_a_base_name_that_means_two_refs_is_refused(repo: Path) -> None:
    """A tag named ``main`` on the pull request's own commit won over the branch (git takes
    the first name that exists, a tag before a branch), so ``--base main`` pinned the pull
    request's checks (a fifth review). An ambiguous name is exit 2; a full ref or id is
    taken as it is."""
    commit(repo, {"calc.py": CALC_BUG, "test_calc.py": "def test_add():\n    assert True\n"})
    git(repo, "tag", "main", "pr")
    proc = run("verify", "--repo", str(repo), "--base", "main")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ambiguous" in proc.stderr and "refs/tags/main" in proc.stderr
    assert "refs/heads/main" in proc.stderr
    hexy = next(n for n in ("cafe", "beef", "f00d", "d00d")  # no object's id starts so
                if not git(repo, "rev-parse", f"--disambiguate={n}").strip())
    git(repo, "branch", hexy, "refs/heads/main")
    for exact in ("refs/heads/main", git(repo, "rev-parse", "refs/heads/main").strip(), hexy):
        code, against = verify(repo, "--base", exact)
        assert code == 1 and against["base"]["held"] == ["test_calc.py"], exact


def test_a_base_without_choir_yaml_pins_nothing_and_says_so(repo: Path) -> None:
    git(repo, "checkout", "-q", "--orphan", "empty")
    git(repo, "rm", "-q", "-r", "--cached", ".")
    git(repo, "commit", "-q", "--allow-empty", "-m", "nothing")
    git(repo, "checkout", "-q", "-f", "pr")
    proc = run("verify", "--repo", str(repo), "--base", "empty")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "holds no choir.yaml" in proc.stderr


PLUGIN = textwrap.dedent("""\
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        report = outcome.get_result()
        report.outcome, report.longrepr = "passed", None
    """)
ENTRY_POINT = {"METADATA": "Metadata-Version: 2.1\nName: choirfix\nVersion: 1.0\n",
               "entry_points.txt": "[pytest11]\nchoirfix = choirfix_plugin\n"}


def _plugin_in(folder: str) -> dict[str, str]:
    return {"choirfix_plugin.py": PLUGIN, **{f"{folder}/{k}": v for k, v in ENTRY_POINT.items()}}


def _autoload(repo: Path) -> None:
    """The base's step with pytest's plugin autoload on, as a plain ``python -m pytest``."""
    _on_main(repo, {"choir.yaml": (repo / "choir.yaml").read_text().replace(NO_PLUGINS, "")})


# Found by a review of --base (each one left every spec-change list empty): a plugin's
# metadata in an upper-case folder (importlib.metadata folds case), or behind a symlink named
# as the folder; pytest 9's ``pytest.toml``; a package pytest imports as it runs
ATTACKS = {
    "DIST-INFO in upper case": (True, _plugin_in("choirfix-1.0.DIST-INFO"), None),
    "dist-info behind a symlink": (True, _plugin_in("meta"), ("choirfix-1.0.dist-info", "meta")),
    "pytest.toml": (False, {"choirfix_plugin.py": PLUGIN,
                            "pytest.toml": '[pytest]\naddopts = ["-p", "choirfix_plugin"]\n'},
                    None),
    "a pygments package": (False, {"pygments/__init__.py": FAKE_PYGMENTS}, None),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_plugin_planted_where_the_spec_did_not_look_is_never_loaded(
        repo: Path, attack: str) -> None:
    autoload, files, link = ATTACKS[attack]
    if autoload:
        _autoload(repo)
    (repo / "calc.py").write_text(CALC_BUG)
    if link:
        (repo / link[0]).symlink_to(link[1])
    commit(repo, files)
    code, own = verify(repo)
    assert code == 0, own["summary"]  # the attack, on the tree's own checks
    code, against = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 1, against["summary"]
    assert results(against)["unit#0"] == "FAIL"
    config = attack == "pytest.toml"  # test configuration: held for a person to read
    assert bool(against["base"]["refused"]) is not config
    assert against["base"]["blocked"].startswith("held" if config else "refused")
    assert against["claim"]["asserted"] is None


CHECKS = "def verify():\n    import calc\n    return calc.add(2, 3) == 5\n"


def _callable_base(repo: Path, ref: str, module: str) -> None:
    """A base whose one check is a callable verifier ``ref``, in ``module`` of the repo."""
    _on_main(repo, {"choir.yaml": f"verifiers:\n  adds:\n    callable: {ref}\n    timeout_s: 20\n",
                    module: CHECKS})


def test_a_callable_named_as_a_module_is_pinned(repo: Path) -> None:
    _callable_base(repo, "calcchecks:verify", "calcchecks.py")
    commit(repo, {"calc.py": CALC_BUG, "calcchecks.py": "def verify():\n    return True\n"})
    code, own = verify(repo)
    assert code == 0, own["summary"]
    code, against = verify(repo, "--base", "main")
    assert code == 1 and against["base"]["held"] == ["calcchecks.py"]
    assert results(against)["adds#0"] == "FAIL"


def test_compiled_bytecode_beside_a_pinned_check_is_never_loaded(repo: Path) -> None:
    _callable_base(repo, "checks/adds.py:verify", "checks/adds.py")
    (repo / "calc.py").write_text(CALC_BUG)
    forged = repo.parent / "forged.py"
    forged.write_text("def verify():\n    return True\n")
    for python in {sys.executable, STEP_PY}:  # the interpreter the check may run under
        subprocess.run([python, "-c", textwrap.dedent(f"""\
            import importlib.util, py_compile
            py_compile.compile({str(forged)!r}, doraise=True, dfile="checks/adds.py",
                cfile=importlib.util.cache_from_source({str(repo / 'checks' / 'adds.py')!r}),
                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
            """)], check=True)
    git(repo, "add", "-A", "-f")
    git(repo, "commit", "-q", "-m", "pr")
    code, own = verify(repo)
    assert code == 0, own["summary"]
    code, against = verify(repo, "--base", "main")
    assert code == 1 and results(against)["adds#0"] == "FAIL"


VENV_PYTHON = f"""#!/bin/sh
d=$(cd "$(dirname "$0")/.." && pwd)
[ "$1" = "-m" ] && [ "$2" = "pytest" ] && shift 2
export PYTHONPATH="$d/hook${{PYTHONPATH:+:$PYTHONPATH}}"
exec {STEP_PY} -c 'import evilhook, sys, pytest; sys.exit(pytest.console_main())' "$@"
"""


def _on_main(repo: Path, files: dict[str, str] | None = None, *,
             move: tuple[str, str] | None = None,
             links: dict[str, str] | None = None) -> None:
    """Main gets a file moved, ``files`` written and ``links`` made; pr restarts there."""
    git(repo, "checkout", "-q", "main")
    if move is not None:
        (repo / move[1]).parent.mkdir(parents=True, exist_ok=True)
        git(repo, "mv", *move)
    for rel, target in (links or {}).items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).symlink_to(target)
    commit(repo, files or {}, "base")
    git(repo, "checkout", "-q", "pr")
    git(repo, "reset", "-q", "--hard", "main")


def _rebase(repo: Path, files: dict[str, str], step: tuple[str, str] | None = None) -> None:
    """Main gets ``files`` (and ``step``'s replacement in its choir.yaml); pr restarts there."""
    if step is not None:
        files = {**files, "choir.yaml": (repo / "choir.yaml").read_text().replace(*step)}
    _on_main(repo, files)


def _src_layout(repo: Path) -> None:
    text = (repo / "choir.yaml").read_text().replace(NO_PLUGINS, f"{NO_PLUGINS} PYTHONPATH=src")
    _on_main(repo, {"choir.yaml": text}, move=("calc.py", "src/calc.py"))


def _zip(files: dict[str, str]) -> bytes:
    import io
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as made:
        for name, text in files.items():
            made.writestr(name, text)
    return out.getvalue()


def _venv(repo: Path) -> None:
    _rebase(repo, {}, (f"{STEP_PY} -m pytest", "python3 -m pytest"))
    commit(repo, {".venv/pyvenv.cfg": f"home = {Path(STEP_PY).parent}\n"
                                      "include-system-site-packages = false\n",
                  ".venv/hook/evilhook.py": REPORTS_PASS, ".venv/bin/python3": VENV_PYTHON})
    (repo / ".venv" / "bin" / "python3").chmod(0o755)
    git(repo, "add", "-f", "-A")
    git(repo, "commit", "-q", "--amend", "--no-edit")


def _src_link(repo: Path) -> None:
    _src_layout(repo)
    git(repo, "rm", "-q", "-r", "src")
    (repo / "lib").mkdir()
    (repo / "src").symlink_to("lib")
    commit(repo, {"lib/calc.py": CALC_BUG, "lib/pytest.py": FAKE_PYTEST})


def _src_zip(repo: Path) -> None:
    _src_layout(repo)
    git(repo, "rm", "-q", "-r", "src")
    (repo / "src").write_bytes(_zip({"calc.py": CALC_BUG, "pytest.py": FAKE_PYTEST.replace(
        'sys.path.append(here)', 'sys.path.append("src")')}))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "pr")


def _data_folder(repo: Path) -> None:
    _rebase(repo, {"xml/sample.xml": "<sample/>\n"})
    commit(repo, {"calc.py": CALC_BUG, "xml/__init__.py": FAKE_XML})


# Found by a second review of --base: where Python looks was the tree's to choose. A
# committed .venv was the steps' interpreter; ``src`` as a link to another folder or as a zip
# put a fake pytest first on the path; a base's data folder named like a standard module
# (``xml/``) was exempt as a root the base had, so a new ``xml/__init__.py`` made it the
# package pytest's JUnit writer imports
SWAPS = {"a committed .venv": _venv, "src as a link": _src_link, "src as a zip": _src_zip,
         "a data folder made a package": _data_folder}


@pytest.mark.parametrize("swap", list(SWAPS))
def test_a_tree_cannot_choose_where_python_looks(repo: Path, swap: str) -> None:
    SWAPS[swap](repo)
    code, own = verify(repo)
    assert code == 0, own["tail_log"][-3000:]  # the attack, on the tree's own checks
    code, against = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 1, against["summary"]
    assert against["base"]["refused"] and against["base"]["blocked"].startswith("refused")
    assert against["claim"]["asserted"] is None


def test_a_line_break_in_a_path_is_refused_not_unseen(repo: Path) -> None:
    """Found by a third review: the spec globs stopped at a line break, so a test module
    under ``a\\n/`` was neither a check nor refused, and patched ``add`` in the base's view."""
    commit(repo, {"calc.py": CALC_BUG, "a\n/test_0patch.py": PATCH_AT_IMPORT})
    code, own = verify(repo)
    assert code == 0, own["summary"]
    code, against = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 1, against["summary"]
    assert against["base"]["refused"] == ["a\n/test_0patch.py"]
    assert results(against)["unit#0"] == "FAIL"


def test_a_path_that_is_not_utf8_is_refused_with_no_traceback(repo: Path) -> None:
    """It crashed the session (no record holds it as text): the check was an ERROR any
    pull request could force."""
    (repo / "calc.py").write_text(CALC_OK)
    fd = os.open(os.fsencode(str(repo)) + b"/test_\xff.py", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"def test_x():\n    assert True\n")
    os.close(fd)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "pr")
    code, against = verify(repo, "--base", "main")
    assert code == 1, against["summary"]
    assert against["base"]["refused"] == ["test_\\xff.py"]


def _in_checks(repo: Path) -> None:
    """The base's test of ``add`` in a folder of its own, ``checks/`` (and one that always
    passes at the root)."""
    _on_main(repo, {"test_sanity.py": "def test_sanity():\n    assert True\n"},
             move=("test_calc.py", "checks/test_calc.py"))


def _linked_check(repo: Path) -> None:
    """The base's test is a link to a file no spec glob matches; the tree rewrites that."""
    _on_main(repo, move=("test_calc.py", "shared/calc_checks.py"),
             links={"tests/test_calc.py": "../shared/calc_checks.py"})
    commit(repo, {"calc.py": CALC_BUG,
                  "shared/calc_checks.py": "def test_add():\n    assert True\n"})


# Found by a fourth review: pytest skips a folder holding conda-meta/history as an
# environment, so the base's test was never collected; pytest puts a test's folder first on
# its path, so a module or an __init__ there stood in for the repo's code; a base test that
# is a link pinned the link, not the file it leads to
HIDES = {
    "conda-meta beside the test": (_in_checks, {"calc.py": CALC_BUG,
                                                "checks/conda-meta/history": "x\n"}),
    "calc.py beside the test": (_in_checks, {"calc.py": CALC_BUG, "checks/calc.py": CALC_OK}),
    "__init__.py beside the test": (_in_checks, {
        "calc.py": CALC_BUG, "checks/__init__.py": "import calc\ncalc.add = lambda a, b: a + b\n"}),
    "the file a linked test leads to": (_linked_check, {}),
}


@pytest.mark.parametrize("hide", list(HIDES))
def test_a_tree_cannot_hide_or_stand_in_for_a_base_test(repo: Path, hide: str) -> None:
    prepare, files = HIDES[hide]
    prepare(repo)
    if files:
        commit(repo, files)
    code, own = verify(repo)
    assert code == 0, own["summary"]
    code, against = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 1, against["summary"]
    assert against["base"]["blocked"] and against["claim"]["asserted"] is None


def _repo_on_the_path(repo: Path) -> None:
    """The base's step puts the repo first on the path (``PYTHONPATH=.``), before the
    ``.pth`` files of site-packages run."""
    text = (repo / "choir.yaml").read_text().replace(NO_PLUGINS, f"{NO_PLUGINS} PYTHONPATH=.")
    _on_main(repo, {"choir.yaml": text})


def _in_qa(repo: Path) -> None:
    _on_main(repo, move=("test_calc.py", "qa/test_calc.py"))


def _in_a_package(repo: Path) -> None:
    """The base's test in a package folder: pytest puts ``qa/``, the first folder up with
    no ``__init__``, first on its path, not ``qa/unit/``."""
    _on_main(repo, {"qa/unit/__init__.py": ""}, move=("test_calc.py", "qa/unit/test_calc.py"))


def _in_qa_unit(repo: Path) -> None:
    _on_main(repo, move=("test_calc.py", "qa/unit/test_calc.py"))


def _conftest_above(repo: Path) -> None:
    """A conftest.py in ``qa/``, the tests in ``qa/unit/``: pytest puts ``qa/`` first too."""
    _on_main(repo, {"qa/conftest.py": "import pytest\n"},
             move=("test_calc.py", "qa/unit/test_calc.py"))


def _in_nested_package(repo: Path) -> None:
    _on_main(repo, {"qa/__init__.py": "", "qa/unit/__init__.py": ""},
             move=("test_calc.py", "qa/unit/test_calc.py"))


def _django_style(repo: Path) -> None:
    """Django's layout: an app's checks in ``app/tests.py``, which pytest collects as its
    configuration says (pytest-django's ``python_files``)."""
    _on_main(repo, {"pytest.ini": "[pytest]\npython_files = tests.py test_*.py\n",
                    "app/__init__.py": ""}, move=("test_calc.py", "app/tests.py"))


# a package found before the base's test module of the same name: it says it is that file
# (so pytest's check of the module's path passes) and defines a test that passes
SAME_NAME = ("import os\n__file__ = os.path.join(os.path.dirname(os.path.dirname(__file__)), "
             "'test_calc.py')\n\ndef test_add():\n    pass\n")
DOCTEST = ">>> import sys\n>>> sys.modules['test_calc'].add = lambda a, b: a + b\n"

# Found by a fifth review: a module a site-packages .pth imports at every start; a package
# named like the base's test module, which Python's finder takes first; pytest's default
# doctest files; a module in the folder pytest puts first for a package of tests
STANDS_IN = {
    "_distutils_hack.py": (_repo_on_the_path, {
        "calc.py": CALC_BUG, "_distutils_hack.py": REPORTS_PASS + "\ndef add_shim():\n"
                                                                 "    pass\n"}),
    "a package named like the base's test": (None, {"calc.py": CALC_BUG,
                                                    "test_calc/__init__.py": SAME_NAME}),
    "that package in a test folder": (_in_qa, {"calc.py": CALC_BUG,
                                               "qa/test_calc/__init__.py": SAME_NAME}),
    "a module above a package of tests": (_in_a_package, {"calc.py": CALC_BUG,
                                                          "qa/calc.py": CALC_OK}),
    "a doctest file": (None, {"calc.py": CALC_BUG, "test_0.txt": DOCTEST}),
    # a sixth review: a package made of the root or of a folder above the tests (pytest
    # imports its __init__ first), an edited __init__ of a package of tests, a module where
    # a conftest.py's folder puts it first, an editable install's loader a .pth imports
    "__init__.py at the root": (None, {"calc.py": CALC_BUG, "__init__.py": REPORTS_PASS}),
    "__init__.py above the tests": (_in_qa_unit, {"calc.py": CALC_BUG,
                                                  "qa/__init__.py": REPORTS_PASS}),
    "an edited __init__.py of the tests' package": (_in_a_package, {
        "calc.py": CALC_BUG, "qa/unit/__init__.py": REPORTS_PASS}),
    "a module beside a conftest.py": (_conftest_above, {"calc.py": CALC_BUG,
                                                        "qa/calc.py": CALC_OK}),
    "_calc_editable_loader.py": (_repo_on_the_path, {
        "calc.py": CALC_BUG, "_calc_editable_loader.py": REPORTS_PASS}),
    # an eighth review: the __init__ of a package of tests above the tests' own folder
    # (pytest imports `qa` before `qa.unit.test_calc`), and Django's tests.py
    "an edited __init__.py above the tests' package": (_in_nested_package, {
        "calc.py": CALC_BUG, "qa/__init__.py": REPORTS_PASS}),
    "an edited tests.py": (_django_style, {
        "calc.py": CALC_BUG, "app/tests.py": "def test_add():\n    assert True\n"}),
}
# shown passing on the tree's own checks only where the interpreter has the .pth
AT_START = {"_distutils_hack.py": "_distutils_hack",
            "_calc_editable_loader.py": "_calc_editable_loader"}


@pytest.mark.parametrize("plant", list(STANDS_IN))
def test_a_tree_cannot_run_its_own_code_in_place_of_a_base_check(repo: Path,
                                                                  plant: str) -> None:
    prepare, files = STANDS_IN[plant]
    if prepare is not None:
        prepare(repo)
    commit(repo, files)
    if plant not in AT_START or _imports_at_start(AT_START[plant]):
        code, own = verify(repo)
        assert code == 0, own["summary"]  # the attack, on the tree's own checks
    code, against = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 1, against["summary"]
    assert results(against)["unit#0"] == "FAIL"
    assert against["claim"]["asserted"] is None
    if plant == "a doctest file":  # a check of the tree's: it runs beside the base's only
        assert against["base"]["added"] == ["test_0.txt"]
    else:
        base = against["base"]  # refused, or (an edit of a file the base had) held
        assert (base["refused"] or base["held"]) and base["blocked"]


def _package_with_tests(repo: Path) -> None:
    """The common layout: the tests inside the package (``calcpkg/tests/``)."""
    _on_main(repo, {"calcpkg/__init__.py": "", "calcpkg/tests/__init__.py": ""},
             move=("test_calc.py", "calcpkg/tests/test_calc.py"))


# what those rules must not refuse: a module of a package that holds its tests (it is never
# first on a path: a sixth review found it refused), a data folder named after its test
# module (pytest-datadir's; a folder without __init__ never stands before the module)
def _package_with_conftest(repo: Path) -> None:
    """networkx's layout: a ``conftest.py`` in the package, the tests below it."""
    _on_main(repo, {"calcpkg/__init__.py": "", "calcpkg/conftest.py": "",
                    "calcpkg/tests/__init__.py": ""},
             move=("test_calc.py", "calcpkg/tests/test_calc.py"))


def _requirements(repo: Path) -> None:
    _on_main(repo, {"requirements/test.txt": "pytest==8.0\n"})


ALLOWED = {
    "a new module of a package holding its tests": (_package_with_tests,
                                                     {"calcpkg/types.py": "X = 1\n"}),
    "a data folder named like its test": (None, {"test_calc/expected.yml": "a: 1\n"}),
    # a seventh review, on real projects: a package with a conftest.py (networkx's) is no
    # import root, and a requirements file named test.txt holds no doctest
    "modules named like standard ones in a package with a conftest.py": (
        _package_with_conftest, {"calcpkg/types.py": "X = 1\n", "calcpkg/_typing.py": ""}),
    "a dependency bump in requirements/test.txt": (_requirements,
                                                   {"requirements/test.txt": "pytest==9.0\n"}),
    # an eighth review: folders of data named like standard modules are no packages
    "data folders named like standard modules": (None, {
        "html/index.html": "<p>hi</p>\n", "locale/fr/LC_MESSAGES/messages.po": "x\n",
        "secrets/README.md": "x\n"}),
}


def test_a_doctest_behind_a_link_runs_beside_the_base_checks_only(repo: Path) -> None:
    """pytest follows a ``test_0.txt`` link to a file no doctest rule reads (``notes.md``):
    a link by that name is taken as a doctest whatever it leads to."""
    (repo / "notes.md").write_text(DOCTEST)
    (repo / "test_0.txt").symlink_to("notes.md")
    commit(repo, {"calc.py": CALC_BUG})
    code, own = verify(repo)
    assert code == 0, own["summary"]  # the attack, on the tree's own checks
    code, against = verify(repo, "--base", "main")
    assert code == 1 and results(against)["unit#0"] == "FAIL", against["summary"]
    assert against["base"]["added"] == ["test_0.txt"]


def test_a_doctest_file_of_the_base_is_pinned(repo: Path) -> None:
    _on_main(repo, {"test_doc.txt": ">>> from calc import add\n>>> add(2, 3)\n5\n"})
    commit(repo, {"test_doc.txt": ">>> 1\n1\n"})
    code, against = verify(repo, "--base", "main")
    assert code == 1 and against["base"]["held"] == ["test_doc.txt"], against["summary"]


@pytest.mark.parametrize("change", list(ALLOWED))
def test_what_stands_in_for_no_check_is_not_refused(repo: Path, change: str) -> None:
    prepare, files = ALLOWED[change]
    if prepare is not None:
        prepare(repo)
    commit(repo, files)
    code, against = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 0, against["summary"]
    assert not against["base"]["refused"] and against["claim"]["asserted"]


@pytest.mark.parametrize("made", ["a file", "a link to another folder"])
def test_a_test_folder_made_a_file_or_a_link_holds_the_tree_with_no_traceback(
        repo: Path, made: str) -> None:
    """``tests/`` turned into a file or a link: the view could not be built
    (``FileExistsError``) or the diff not read (``NotADirectoryError``), a traceback any pull
    request could force (a sixth review). Its tests count as deleted: held."""
    _on_main(repo, move=("test_calc.py", "tests/test_calc.py"))
    shutil.rmtree(repo / "tests")
    if made == "a file":
        (repo / "tests").write_text("not a folder\n")
    else:
        (repo / "other").mkdir()
        (repo / "other" / "test_ok.py").write_text("def test_ok():\n    assert True\n")
        (repo / "tests").symlink_to("other")
    commit(repo, {"calc.py": CALC_BUG})
    code, against = verify(repo, "--base", "main", "--claim", "ci")
    assert code == 1, against["summary"]
    assert against["base"]["deleted"] == ["tests/test_calc.py"] and against["base"]["blocked"]
    assert against["claim"]["asserted"] is None


def _imports_at_start(module: str) -> bool:
    """Whether a ``.pth`` file of the steps' interpreter imports ``module`` at its start."""
    import site

    folders = [*site.getsitepackages([os.path.realpath(sys.base_prefix)])]
    for folder in map(Path, folders):
        for pth in folder.glob("*.pth") if folder.is_dir() else ():
            if any(line.startswith("import") and module in line
                   for line in pth.read_text(errors="replace").splitlines()):
                return True  # what site runs: a line that starts with "import"
    return False


# the change's code, imported by the base's test: it tries every way to rewrite that test in
# the view it runs in (hard links to the sealed snapshot's files, so a write that got through
# would change the evidence, and every later round linked to it); any way that works makes
# `add` right, so the base's test passes and the test below fails
WRITE_THROUGH = CALC_BUG + textwrap.dedent("""\

    import os as _os

    _here = _os.path.dirname(_os.path.abspath(__file__))
    _test = _os.path.join(_here, "test_calc.py")
    _weak = "def test_add():\\n    assert True\\n"

    def _write():
        with open(_test, "w") as fh:
            fh.write(_weak)

    def _append():
        with open(_test, "a") as fh:
            fh.write("\\ntest_add = lambda: None\\n")

    def _replace():
        with open(_test + ".new", "w") as fh:
            fh.write(_weak)
        _os.replace(_test + ".new", _test)

    _attempts = [_write, _append, _replace,
                 lambda: _os.chmod(_test, 0o666), lambda: _os.utime(_test, (0, 0)),
                 lambda: _os.link(_test, _os.path.join(_here, "test_linked.py")),
                 lambda: _os.unlink(_test), lambda: _os.truncate(_test, 0)]
    _through = []
    for _attempt in _attempts:
        try:
            _attempt()
            _through.append(_attempt)
        except OSError:
            pass
    if _through:
        def add(a, b):
            return a + b
    """)


def test_the_view_cannot_be_written_through_to_the_sealed_snapshot(repo: Path) -> None:
    """A spec view is hard links into the sealed snapshot (the cost of a copy was seconds on
    a big tree): the code under test tries to rewrite the base's test in it by every route
    (write, append, replace, chmod, utime, link, unlink, truncate), and nothing gets
    through, neither to this round nor to the next one built from the same snapshot."""
    commit(repo, {"calc.py": WRITE_THROUGH})
    before = (repo / "test_calc.py").read_bytes()
    verdicts = []
    for _ in range(2):  # the second round links the same sealed files again
        code, against = verify(repo, "--base", "main", "--claim", "ci")
        verdicts.append((code, results(against)["unit#0"]))
    assert verdicts == [(1, "FAIL"), (1, "FAIL")], verdicts
    assert (repo / "test_calc.py").read_bytes() == before
    code, own = verify(repo)  # the tree's own test, from the same store: intact too
    assert code == 1 and results(own)["unit#0"] == "FAIL"
    audit = run("audit")
    assert audit.returncode == 0, audit.stdout + audit.stderr


@pytest.mark.parametrize("silence", [
    "# ruff: noqa\n",  # the whole file
    "",  # per line, below
])
def test_a_suppression_the_change_adds_never_turns_a_failing_lint_into_a_pass(
        tmp_path: Path, silence: str) -> None:
    """Review 20a (critical): a lint obeys the suppressions in the code it checks, and they
    were nobody's spec: a pull request that fails the base's lint added ``# ruff: noqa`` (or
    ``# noqa`` on its lines), PASSed against ``--base main`` and opened the gate. A new
    suppression is a change to the checks: held for a person, never a PASS on its own; the
    base's own suppressions stay the project's."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(  # the test venv's interpreter, which has ruff
        f"sandbox: {{python: {sys.executable}}}\n"
        "verifiers:\n  lint:\n    kind: lint\n    parser: ruff\n    steps:\n"
        "      - {name: ruff, command: 'python3 -m ruff check --no-cache --isolated "
        "--select F --output-format json .'}\n")
    (repo / "calc.py").write_text("import sys  # noqa: F401\n\n\ndef add(a, b):\n"
                                  "    return a + b\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "pr")
    bad = "import os\nimport sys  # noqa: F401\n\n\ndef add(a, b):\n    return a + b\n"
    commit(repo, {"calc.py": bad})
    code, plain = verify(repo, "--base", "main", "--claim", "pr")
    assert code == 1 and results(plain)["lint#0"] == "FAIL", plain  # the lint fails the change
    silenced = silence + bad if silence else bad.replace("import os\n", "import os  # noqa\n")
    commit(repo, {"calc.py": silenced})
    code, against = verify(repo, "--base", "main", "--claim", "pr")
    assert code == 1 and against["status"] == "FAIL", against
    assert "calc.py" in against["base"]["held"] + against["base"].get("refused", []), against
    gate = run("gate", "pr", "--repo", str(repo))
    assert gate.returncode == 1, gate.stdout + gate.stderr
    # the base's own suppression, kept as it was, is no change
    commit(repo, {"calc.py": "import sys  # noqa: F401\n\n\ndef add(a, b):\n"
                             "    return a - b\n"})
    code, kept = verify(repo, "--base", "main", "--claim", "pr2")
    assert code == 0 and kept["status"] == "PASS", kept
