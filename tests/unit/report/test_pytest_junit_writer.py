"""The pytest preset's JUnit writer (``choir/sandbox/pytest_junit.py``) against pytest's own.

The preset's step is ``python3 -c "$CHOIR_PYTEST"``: pytest with a light writer in place of
``--junitxml``. Every kind of result pytest reports (pass, failure, setup and teardown errors,
skips, xfail, strict xpass, subtests, collection errors, parametrized ids holding XML's own
characters and ones XML cannot hold) must read the same to the ``junit`` parser as pytest's
own XML does: the same totals, the same tests, the same problems.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from choir.models import Result
from choir.report.build import tool_of
from choir.sandbox.base import pytest_command, pytest_source, step_env
from tests.unit.report.test_report_pipeline import PYTEST, verify
from tests.workitems import NO_PLUGINS

SUITE = {
    "tests/__init__.py": "",
    "tests/test_kinds.py": '''
        import pytest

        def test_pass():
            assert True

        def test_fail():
            value = 1
            assert value == 2, "one is not two"

        @pytest.fixture
        def broken():
            raise RuntimeError("setup & <boom>")

        def test_setup_error(broken):
            pass

        @pytest.fixture
        def bad_teardown():
            yield
            raise ValueError("teardown went \\"wrong\\"")

        def test_teardown_error_after_pass(bad_teardown):
            pass

        def test_teardown_error_after_fail(bad_teardown):
            assert 0

        @pytest.mark.skip(reason="not today")
        def test_marked_skip():
            pass

        def test_skip_inside():
            pytest.skip("skipped\\x07 from within")

        @pytest.mark.xfail(reason="known bug")
        def test_xfail():
            assert 0

        @pytest.mark.xfail(reason="fixed meanwhile")
        def test_xpass():
            pass

        @pytest.mark.xfail(reason="must fail", strict=True)
        def test_xpass_strict():
            pass

        @pytest.mark.parametrize("text", ["a<b", 'q"uote', "amp&", "tab\\tnl\\n", "bell\\x07",
                                          "caf\\u00e9"])
        def test_params(text):
            assert "b" not in text

        def test_long_lines():  # pytest shortens a message attribute to whole lines
            raise ValueError("\\n".join(["y" * 100] * 10))

        @pytest.fixture
        def long_setup():
            raise ValueError("z" * 800)

        def test_long_line_in_setup(long_setup):
            pass

        class TestGroup:
            def test_in_class(self):
                print("captured\\x00 output")
                assert [1, 2] == [1, 3]

            def test_ok(self):
                pass
    ''',
    "tests/test_subtests.py": '''
        import unittest

        class TestSub(unittest.TestCase):
            def test_each(self):
                for i in range(4):
                    with self.subTest(i=i):
                        self.assertNotEqual(i, 2)
    ''',
    "tests/test_broken.py": "def test_never(:\n    pass\n",
    "tests/test_skipped_module.py": '''
        import pytest
        pytest.skip("the whole module", allow_module_level=True)
    ''',
}


def _suite(root: Path) -> Path:
    for rel, body in SUITE.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body))
    return root


def _run(root: Path, argv: list[str], out: Path) -> int:
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "CHOIR_OUT": str(out),
           "PYTHONDONTWRITEBYTECODE": "1"}
    out.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, *argv], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120).returncode


def _read(path: Path) -> tuple[dict[str, str], Counter[tuple[str, ...]], Counter[tuple[str, ...]]]:
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    totals = {k: suite.get(k, "") for k in ("tests", "failures", "errors", "skipped")}
    cases: Counter[tuple[str, ...]] = Counter()
    problems: Counter[tuple[str, ...]] = Counter()
    for case in suite.iter("testcase"):  # two for a test whose call and teardown failed
        key = tuple(case.get(k) or "" for k in ("classname", "name", "file", "line"))
        cases[key] += 1
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                text = re.sub(r"0x[0-9a-f]+", "0x", child.text or "")  # object addresses
                problems[(*key, child.tag, child.get("type") or "", child.get("message") or "",
                          text)] += 1
    return totals, cases, problems


def test_the_writer_reads_as_pytest_junitxml_does(tmp_path: Path) -> None:
    root = _suite(tmp_path / "proj")
    theirs = _run(root, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                         "junit_family=xunit1", f"--junitxml={tmp_path / 'theirs.xml'}"],
                  tmp_path / "unused")
    ours = _run(root, ["-c", pytest_source(), "-q", "-p", "no:cacheprovider"],
                tmp_path / "out")
    assert ours == theirs == 2  # pytest's own code: a collection error interrupts the run
    root = _suite(tmp_path / "proj")
    (root / "tests" / "test_broken.py").unlink()
    theirs = _run(root, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                         "junit_family=xunit1", f"--junitxml={tmp_path / 'theirs.xml'}"],
                  tmp_path / "unused")
    ours = _run(root, ["-c", pytest_source(), "-q", "-p", "no:cacheprovider"],
                tmp_path / "out")
    assert ours == theirs == 1
    want, got = _read(tmp_path / "theirs.xml"), _read(tmp_path / "out" / "junit.xml")
    assert got[0] == want[0]  # the suite's totals: every subtest a test, as pytest counts
    assert got[1] == want[1]  # the same tests, named alike
    # the same problems: messages and texts (pytest's text of a failure is its longrepr)
    assert got[2] == want[2]


@pytest.mark.parametrize("prefix", [[], ["--junitprefix=pre"]])
def test_a_collection_error_reads_as_pytest_junitxml_does(tmp_path: Path,
                                                          prefix: list[str]) -> None:
    root = _suite(tmp_path / "proj")
    _run(root, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                *prefix, f"--junitxml={tmp_path / 'theirs.xml'}"], tmp_path / "unused")
    _run(root, ["-c", pytest_source(), "-q", "-p", "no:cacheprovider", *prefix],
         tmp_path / "out")
    assert _read(tmp_path / "out" / "junit.xml") == _read(tmp_path / "theirs.xml")


def test_the_parser_finds_the_same_failures_in_either(tmp_path: Path) -> None:
    root = _suite(tmp_path / "proj")
    (root / "tests" / "test_broken.py").unlink()
    theirs, _, _ = verify(root, f"{PYTEST} -o junit_family=xunit1", "junit", run_id="theirs")
    ours, _, _ = verify(root, f'{NO_PLUGINS} {sys.executable} -c "$CHOIR_PYTEST" -q',
                        "junit", run_id="ours")
    assert ours.result is theirs.result is Result.FAIL
    assert ours.counts == theirs.counts
    assert ours.counts.failed and ours.counts.errors and ours.counts.skipped
    assert {(s.test_id, s.kind, s.location) for s in ours.failure_signatures} == \
        {(s.test_id, s.kind, s.location) for s in theirs.failure_signatures}
    assert ours.summary.replace("ours", "theirs") == theirs.summary


def test_a_passing_suite_passes_and_a_junitxml_in_addopts_writes_nowhere(
        tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    (root / "pytest.ini").write_text("[pytest]\naddopts = --junitxml=report.xml\n")
    report, result, _ = verify(root, f'{NO_PLUGINS} {sys.executable} -c "$CHOIR_PYTEST" -q',
                               "junit")
    assert report.result is Result.PASS, report.summary
    assert report.counts.run == 1
    assert not (root / "report.xml").exists()
    assert [r.exit_code for r in result.manifest.commands_executed] == [0]


def test_pytest_missing_is_said_as_python_m_would_say_it(tmp_path: Path) -> None:
    """No pytest in the interpreter: the words ``python3 -m pytest`` would print, so the
    report says the checks did not run (INCONCLUSIVE), never a failing suite."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "pytest.py").write_text("raise ImportError('no pytest here')\n")
    root = tmp_path / "proj"
    root.mkdir()
    (root / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    report, _, _ = verify(root, f'PYTHONPATH={shadow} {sys.executable} -c "$CHOIR_PYTEST" -q',
                          "junit")
    assert report.result is Result.INCONCLUSIVE, report.summary
    assert "not installed" in report.summary


@pytest.mark.parametrize("command", ['python3 -c "$CHOIR_PYTEST" -q',
                                     'PYTEST_ADDOPTS=-x python3 -c "$CHOIR_PYTEST"'])
def test_the_preset_step_is_known_as_pytest(command: str) -> None:
    assert tool_of(command) == "pytest"


def test_every_step_has_the_writer_in_its_environment() -> None:
    env = step_env("/out", {})
    assert env["CHOIR_PYTEST"] == pytest_command()
    assert repr(pytest_source()) in env["CHOIR_PYTEST"]
    assert "import choir" not in env["CHOIR_PYTEST"]  # it runs where Choir is not installed
    assert "from choir" not in env["CHOIR_PYTEST"]
