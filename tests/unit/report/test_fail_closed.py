"""Reports fail closed (issue #11 items 10 and 11): a crashed tool is INCONCLUSIVE, not a bug
in the code, and a report that cannot be built still leaves signed evidence.

Every run here is real: real pytest, ruff and mypy in the local sandbox, a real artifact
store, a real signer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from choir._core.registry import PARSERS
from choir.attest import AttestationStore, load_signer, verify_attestation
from choir.evidence.artifacts import ArtifactStore
from choir.models import Counts, Result, StepSpec, Target, VerifierKind, VerifierSpec
from choir.report import register_parser
from choir.report.parsers import ParseInput, ParseResult
from choir.sandbox import get_sandbox
from choir.verification import attest_run, run_verifier_thread
from tests.unit.report.test_report_pipeline import PY, PYTEST, project, verify
from tests.workitems import NO_PLUGINS

BIN = Path(PY).parent


def _inconclusive(report, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert report.result is Result.INCONCLUSIVE, (report.result, report.summary)
    assert needle in report.summary, report.summary
    assert report.confidence <= 0.2


def test_pytest_usage_error_is_inconclusive_not_fail(tmp_path: Path) -> None:
    repo = project(tmp_path, "def test_a(): pass\n")
    report, _, _ = verify(repo, PYTEST + " --no-such-flag", "junit")
    _inconclusive(report, "pytest usage error (exit 4)")


def test_pytest_no_tests_collected_is_inconclusive_not_fail(tmp_path: Path) -> None:
    repo = project(tmp_path, "x = 1\n")
    report, _, _ = verify(repo, PYTEST, "junit")
    _inconclusive(report, "no tests collected (exit 5)")


def test_pytest_internal_error_is_inconclusive_not_fail(tmp_path: Path) -> None:
    repo = project(tmp_path, "def test_a(): pass\n")
    (repo / "conftest.py").write_text(
        "def pytest_collection_modifyitems(items):\n    raise RuntimeError('plugin bug')\n")
    report, _, _ = verify(repo, PYTEST, "junit")
    _inconclusive(report, "pytest internal error (exit 3)")


def test_pytest_interrupted_is_inconclusive_not_fail(tmp_path: Path) -> None:
    repo = project(tmp_path, "def test_a(): pass\n")
    (repo / "conftest.py").write_text(
        "def pytest_collection_finish(session):\n"
        "    raise KeyboardInterrupt\n")
    report, _, _ = verify(repo, f"{NO_PLUGINS} {PY} -m pytest -q -p no:cacheprovider", "pytest")
    _inconclusive(report, "pytest interrupted (exit 2)")


def test_a_collection_error_in_the_code_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    """pytest exits 2 on collection errors too: a syntax error the executor made is a bug in
    the code, and the executor must hear about it (FAIL), not a halt for a human."""
    repo = project(tmp_path, "from calc import add\n\ndef test_a():\n    assert add(1, 2) == 3\n")
    (repo / "calc.py").write_text("def add(a, b)\n    return a + b\n")
    text = f"{NO_PLUGINS} {PY} -m pytest -q -p no:cacheprovider"
    for parser, command in (("junit", PYTEST), ("pytest", text)):
        report, _, _ = verify(repo, command, parser, run_id=f"r-{parser}")
        assert report.result is Result.FAIL, (parser, report.result, report.summary)
        assert "could not collect" in report.summary


def test_a_tool_that_is_not_installed_is_inconclusive_not_fail(tmp_path: Path) -> None:
    """A missing tool says nothing about the code: the executor must not chase it."""
    repo = project(tmp_path, "def test_a(): pass\n")
    report, _, _ = verify(repo, f"{PY} -m no_such_tool_xyz check .", "generic", run_id="r-mod")
    assert report.result is Result.FAIL  # not a tool Choir knows: the exit code decides
    report, _, _ = verify(repo, "no-such-command-xyz --check", "generic", run_id="r-cmd")
    _inconclusive(report, "command not found (exit 127)")
    report, _, _ = verify(repo, f"{PY} -c 'import sys; print(\"{PY}: No module named ruff\");"
                                f" sys.exit(1)' && true", "generic", run_id="r-ruff")
    assert report.result is Result.FAIL  # the command is not ruff: no excuse taken


def test_a_python_module_tool_that_is_not_installed_is_inconclusive(tmp_path: Path) -> None:
    repo = project(tmp_path, "def test_a(): pass\n")
    report, _, _ = verify(repo, f"{PY} -I -S -m ruff check .", "ruff", run_id="r-noruff")
    _inconclusive(report, "ruff is not installed")


def test_ruff_crash_exit_2_is_inconclusive_not_fail(tmp_path: Path) -> None:
    repo = project(tmp_path, "x = 1\n")
    report, _, _ = verify(repo, f"{BIN / 'ruff'} check --no-cache --select NOPE999 "
                          "--output-format json .", "ruff", kind=VerifierKind.LINT)
    _inconclusive(report, "ruff could not run (exit 2)")


def test_mypy_crash_exit_2_is_inconclusive_not_fail(tmp_path: Path) -> None:
    repo = project(tmp_path, "x = 1\n")
    report, _, _ = verify(repo, f"{BIN / 'mypy'} --no-such-option .", "mypy",
                          kind=VerifierKind.TYPECHECK)
    _inconclusive(report, "mypy could not run (exit 2)")


def test_mypy_type_errors_still_fail(tmp_path: Path) -> None:
    repo = project(tmp_path, "x: int = 'a'\n")
    report, _, _ = verify(repo, f"{BIN / 'mypy'} --no-incremental --cache-dir /dev/null .",
                          "mypy", kind=VerifierKind.TYPECHECK)
    assert report.result is Result.FAIL and report.counts.failed == 1


def test_a_promised_junit_file_that_is_missing_is_inconclusive(tmp_path: Path) -> None:
    repo = project(tmp_path, "def test_a(): assert False\n")
    # promised junit, but the command writes none and exits 1
    report, _, _ = verify(repo, f"{NO_PLUGINS} {PY} -m pytest -q -p no:cacheprovider", "junit")
    _inconclusive(report, "no JUnit XML")


def test_real_test_failures_still_fail(tmp_path: Path) -> None:
    repo = project(tmp_path, "def test_a(): assert False\n")
    report, _, _ = verify(repo, PYTEST, "junit")
    assert report.result is Result.FAIL and len(report.failure_signatures) == 1


TWENTY_XML = (f"{PY} -c \"import os; d=os.environ['CHOIR_OUT']; "
              "[open(os.path.join(d, f'r{i:02d}.xml'), 'w').write("
              "'<testsuite><testcase name=\\\"t\\\"/></testsuite>') for i in range(20)]\"")


def test_twenty_xml_files_do_not_crash_the_report(tmp_path: Path) -> None:
    repo = project(tmp_path, "x = 1\n")
    report, result, _ = verify(repo, TWENTY_XML, "junit")
    assert report.result is Result.PASS and report.counts.run == 20
    assert len(report.artifacts) <= 16 and "manifest" in report.artifacts
    listed = sum(k.endswith(".xml") for k in report.artifacts)
    assert f"{20 - listed} more artifact(s)" in report.summary
    assert sum(k.endswith(".xml") for k in result.manifest.files) == 20


def _attested(tmp_path: Path, spec: VerifierSpec):  # type: ignore[no-untyped-def]
    repo = project(tmp_path, "x = 1\n")
    store = ArtifactStore()
    target = Target(work_item="wi", tree_hash="0" * 64)
    run, _ = asyncio.run(run_verifier_thread(spec, repo=repo, target=target,
                                             sandbox=get_sandbox("local"), store=store,
                                             run_id="fc"))
    attestations = AttestationStore()
    att = attest_run(run, spec, store=store, signer=load_signer(), attestations=attestations,
                     policy_hash=None, mood="CALM")
    assert verify_attestation(att, artifacts=store) == []
    assert attestations.get(att.id) is not None
    return run, att


def test_twenty_xml_files_through_the_green_thread_mint_an_attestation(tmp_path: Path) -> None:
    spec = VerifierSpec(name="v", kind=VerifierKind.UNIT_TESTS, parser="junit", timeout_s=60,
                        steps=(StepSpec(name="run", command=TWENTY_XML),))
    run, att = _attested(tmp_path, spec)
    assert att.body.result is Result.PASS and run.report.counts.run == 20


@pytest.fixture
def buggy_parser() -> Iterator[str]:
    """A plugin parser with a bug: it returns something that is not a failure signature."""
    name = "buggy-test-parser"

    def parse(inp: ParseInput) -> ParseResult:
        result = ParseResult()
        result.signatures.append("not a signature")  # type: ignore[arg-type]
        result.counts = Counts(run=1, failed=1)
        return result

    register_parser(name)(parse)
    yield name
    PARSERS.unregister(name)


def test_a_report_that_cannot_be_built_still_leaves_signed_evidence(
        tmp_path: Path, buggy_parser: str) -> None:
    spec = VerifierSpec(name="v", kind=VerifierKind.UNIT_TESTS, parser=buggy_parser,
                        timeout_s=60, steps=(StepSpec(name="run", command="exit 3"),))
    run, att = _attested(tmp_path, spec)
    assert att.body.result is Result.FAIL  # the exit code decides
    assert run.report.reporter == "deterministic_fallback"
    assert "exited 3" in run.report.summary and "could not be built" in run.report.summary


def test_a_passing_run_whose_report_cannot_be_built_is_inconclusive_never_pass(
        tmp_path: Path, buggy_parser: str) -> None:
    spec = VerifierSpec(name="v", kind=VerifierKind.UNIT_TESTS, parser=buggy_parser,
                        timeout_s=60, steps=(StepSpec(name="run", command="true"),))
    run, att = _attested(tmp_path, spec)
    assert att.body.result is Result.INCONCLUSIVE
    assert "report could not be built" in run.report.summary


EVERY_OUTCOME = """
    import unittest
    import pytest
    def test_ok(): pass
    def test_bad(): assert 0
    @pytest.mark.skip
    def test_skip(): pass
    @pytest.mark.xfail
    def test_xf(): assert 0
    @pytest.mark.xfail
    def test_xp(): pass
    @pytest.fixture
    def broken():
        raise RuntimeError("setup")
    def test_err(broken): pass
    @pytest.fixture
    def bad_teardown():
        yield
        raise RuntimeError("teardown")
    def test_td(bad_teardown): pass
    class T(unittest.TestCase):
        def test_sub(self):
            for i in range(3):
                with self.subTest(i=i):
                    self.assertNotEqual(i, 1)
    def test_subtests(subtests):
        for i in range(3):
            with subtests.test(i=i):
                assert i != 2
"""
# pytest's own count of this file: "4 failed, 3 passed, 1 skipped, 1 xfailed, 1 xpassed,
# 2 errors, 4 subtests passed"; its JUnit testsuite: tests=15 failures=4 errors=2 skipped=2
# (an xfail is a skip in JUnit; every subtest is a test).
PYTEST_COUNTS = (15, 4, 2, 2)


def _counts(report) -> tuple[object, ...]:  # type: ignore[no-untyped-def]
    c = report.counts
    return (c.run, c.failed, c.errors, c.skipped)


def test_junit_counts_subtests_skips_xfail_xpass_and_errors_as_pytest_does(
        tmp_path: Path) -> None:
    repo = project(tmp_path, EVERY_OUTCOME)
    report, _, _ = verify(repo, PYTEST, "junit")
    assert report.result is Result.FAIL
    assert _counts(report) == PYTEST_COUNTS
    ids = {s.test_id for s in report.failure_signatures}
    assert {"test_x.py::test_bad", "test_x.py::T::test_sub", "test_x.py::test_subtests",
            "test_x.py::test_err", "test_x.py::test_td"} <= ids


def test_pytest_text_counts_match_the_junit_counts(tmp_path: Path) -> None:
    repo = project(tmp_path, EVERY_OUTCOME)
    report, _, _ = verify(repo, f"{NO_PLUGINS} {PY} -m pytest -q -rA -p no:cacheprovider", "pytest")
    assert report.result is Result.FAIL
    assert _counts(report) == PYTEST_COUNTS


def test_junit_cannot_hide_failures_behind_its_summary_attributes(tmp_path: Path) -> None:
    repo = project(tmp_path, "x = 1\n")
    xml = ('<testsuite tests="1" failures="0" errors="0" skipped="0">'
           '<testcase name="a"><failure message="boom"/></testcase>'
           '<testcase name="b"/></testsuite>')
    (repo / "j.xml").write_text(xml)
    report, _, _ = verify(repo, 'cp j.xml "$CHOIR_OUT/j.xml"', "junit")
    assert report.result is Result.FAIL and _counts(report) == (2, 1, 0, 0)
