"""The code under test chooses how its tests end; none of it makes a PASS (review 17f).

Each case is the code under test (``calc.py``) or its test file acting on the process it
runs in: a SkipTest raised in the call, ``pytest.exit`` inside a test, ``os._exit`` before
the summary, a message that reads like a missing tool, a segfault. Each was a PASS or an
INCONCLUSIVE (which costs no attempt and never tells the executor) on the old code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.models import Result
from choir.report.signatures import signature_id
from tests.unit.report.test_report_pipeline import PY, PYTEST, project, verify
from tests.workitems import NO_PLUGINS

TEXT = f"{NO_PLUGINS} {PY} -m pytest -q -p no:cacheprovider"
WRITER = f'{NO_PLUGINS} {PY} -c "$CHOIR_PYTEST" -q -p no:cacheprovider'  # the preset's step


@pytest.mark.parametrize(("command", "parser"), [(PYTEST, "junit"), (TEXT, "pytest"),
                                                  (WRITER, "junit")])
def test_a_session_of_tests_the_code_skipped_is_no_pass(tmp_path: Path, command: str,
                                                        parser: str) -> None:
    repo = project(tmp_path, """
        import unittest
        def add(a, b):
            raise unittest.SkipTest("not today")
        def test_add(): assert add(2, 3) == 5
        def test_add_more(): assert add(1, 1) == 2
    """)
    report, _, _ = verify(repo, command, parser)
    assert report.result is Result.INCONCLUSIVE, report.summary
    assert "no test ran" in report.summary


def test_a_session_ended_inside_a_test_is_no_pass(tmp_path: Path) -> None:
    """``pytest.exit(returncode=0)`` in the failing test: the writer recorded the test that
    never finished as a clean case, and the session PASSed."""
    repo = project(tmp_path, """
        import pytest
        def test_ok(): pass
        def test_add():
            pytest.exit("ok", returncode=0)
            assert 2 + 3 == 6
    """)
    report, _, _ = verify(repo, WRITER, "junit")
    assert report.result is Result.FAIL, report.summary
    assert any("never finished" in s.excerpt for s in report.failure_signatures)


def test_a_summary_never_reached_is_no_pass(tmp_path: Path) -> None:
    """``os._exit(0)`` before the failing test: no summary line, every count unknown, yet
    ``parser: pytest`` PASSed ("every step exited 0")."""
    repo = project(tmp_path, """
        import os
        def test_ok(): pass
        def test_add():
            os._exit(0)
    """)
    report, _, _ = verify(repo, TEXT, "pytest")
    assert report.result is Result.INCONCLUSIVE, report.summary
    assert "no pytest summary line" in report.summary


@pytest.mark.parametrize("how", ["message", "exit_127"])
def test_failed_tests_are_a_fail_whatever_the_process_says_after(tmp_path: Path,
                                                                  how: str) -> None:
    """A failing test whose message names "No module named pytest_myplugin" (a substring
    match read it as pytest missing), or an ``atexit`` leaving with 127 after the failures:
    INCONCLUSIVE, "fix the verifier's command", never sent to the executor."""
    body = {"message": """
        def test_add():
            raise ImportError("No module named pytest")
    """, "exit_127": """
        import atexit, os
        atexit.register(lambda: os._exit(127))
        def test_add(): assert 2 + 3 == 6
    """}[how]
    report, _, _ = verify(project(tmp_path, body), PYTEST, "junit")
    assert report.result is Result.FAIL, report.summary
    assert report.counts.failed == 1


def test_a_segfault_in_the_code_under_test_is_a_fail(tmp_path: Path) -> None:
    repo = project(tmp_path, """
        import ctypes
        def test_add(): ctypes.string_at(0)
    """)
    report, _, _ = verify(repo, PYTEST, "junit")
    assert report.result is Result.FAIL, report.summary
    assert "signal 11 (SIGSEGV)" in report.summary


def test_a_test_id_past_256_characters_keeps_the_counts(tmp_path: Path) -> None:
    """``parse_pytest_text`` passed the whole id to a 256-character field: the parser
    crashed, and the counts and every signature went with it."""
    repo = project(tmp_path, """
        import pytest
        @pytest.mark.parametrize("x", ["y" * 300], ids=["case-" + "y" * 300])
        def test_long(x): assert x == "z"
        def test_short(): assert 1 == 2
    """)
    report, _, _ = verify(repo, TEXT, "pytest")
    assert report.result is Result.FAIL
    assert report.counts.failed == 2 and len(report.failure_signatures) == 2


def test_two_tests_of_one_name_in_two_folders_are_two_failures() -> None:
    same = "assert 1 == 2"
    assert signature_id("junit", "tests/unit/test_api.py::test_a", None, same) != \
        signature_id("junit", "tests/integration/test_api.py::test_a", None, same)


def test_the_log_is_read_once_for_every_failing_case(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each failing ``<testcase>`` scanned the whole log for its section: quadratic (2,000
    failing cases: 23 s, the event loop blocked, no deadline), and a log of short lines with
    case names absent from it stalled a round for hours. One pass indexes the sections; a
    name found in none is looked for only for the signatures listed (``MAX_SIGNATURES``)."""
    from choir.models.report import MAX_SIGNATURES
    from choir.report import junit

    reads = []
    real = junit._lines
    monkeypatch.setattr(junit, "_lines", lambda inp, rel: reads.append(rel) or real(inp, rel))
    repo = project(tmp_path, """
        import pytest
        @pytest.mark.parametrize("i", range(300))
        def test_many(i): assert i < 0
    """)
    report, _, _ = verify(repo, PYTEST, "junit")
    assert report.result is Result.FAIL and report.counts.failed == 300
    assert len(reads) <= MAX_SIGNATURES + 2, len(reads)


@pytest.mark.parametrize("where", ["teardown", "setup", "between"])
def test_a_session_ended_outside_a_call_is_no_pass(tmp_path: Path, where: str) -> None:
    """Review 17g: ``pytest.exit(returncode=0)`` in a fixture's teardown of a passing test,
    in a fixture's setup, or from a profile hook between two tests: pytest re-raised it
    before any report of the failing tests, which then had no ``<testcase>`` at all, while
    the tests that passed before made a PASS (ASSERTed in PARANOID). The writer knows what
    was collected: a test the session never ran to its end, when nothing failed, fails."""
    body = {"teardown": """
        import pytest
        @pytest.fixture
        def conn():
            yield 1
            pytest.exit("bye", returncode=0)
        def test_add(conn): assert 2 + 3 == 5
        def test_mul(conn): assert 2 * 3 == 5
    """, "setup": """
        import pytest
        def test_add(): assert 2 + 3 == 5
        @pytest.fixture
        def conn():
            pytest.exit("bye", returncode=0)
        def test_mul(conn): assert 2 * 3 == 5
    """, "between": """
        import sys, pytest
        def hook(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "pytest_runtest_setup":
                pytest.exit("bye", returncode=0)
        def test_add():
            sys.setprofile(hook)
            assert 2 + 3 == 5
        def test_mul(): assert 2 * 3 == 5
    """}[where]
    report, _, _ = verify(project(tmp_path, body), WRITER, "junit")
    assert report.result is Result.FAIL, report.summary
    assert any("never finished" in s.excerpt for s in report.failure_signatures)


@pytest.mark.parametrize("code", [3, 4, 5, 127])
def test_a_session_ended_with_a_crash_code_is_a_fail(tmp_path: Path, code: int) -> None:
    """Review 17g: ``pytest.exit(returncode=127)`` (or 3, 4, 5) in the failing call: the
    writer recorded the test, yet the crash code read "the checks did not run"."""
    repo = project(tmp_path, f"""
        import pytest
        def test_add(): assert 2 + 3 == 5
        def test_mul():
            pytest.exit("bye", returncode={code})
    """)
    report, _, _ = verify(repo, WRITER, "junit")
    assert report.result is Result.FAIL, report.summary


def test_a_log_of_dotted_titles_is_indexed_in_bounded_memory(choir_home: Path) -> None:
    """Review 17g: the one-pass index keyed every section title by each suffix after each
    of its dots: 400 header lines of 2,000 dots (1.6 MB of log) took 1.6 GiB and 7 s."""
    import resource

    from choir.evidence.artifacts import ArtifactStore
    from choir.report.junit import parse_junit
    from choir.report.parsers import ParseInput

    store = ArtifactStore()
    lines = [f"___ t{'.a' * 2000}.{i:06d} ___" for i in range(400)]
    lines += ["___ test_x ___", "E   assert 1 == 2"]
    junit = (b'<?xml version="1.0"?><testsuites><testsuite name="p" tests="1" failures="1">'
             b'<testcase classname="test_m" name="test_x" file="test_m.py">'
             b'<failure message="assert 1 == 2">boom</failure></testcase></testsuite>'
             b'</testsuites>')
    artifacts = {"logs/combined.log": store.ingest_bytes(("\n".join(lines) + "\n").encode()),
                 "out/junit.xml": store.ingest_bytes(junit)}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = parse_junit(ParseInput(artifacts=artifacts, store=store, exit_codes=[1]))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result.counts.failed == 1 and grown_mib < 200, grown_mib


def test_a_session_of_xfails_is_no_pass_with_either_parser(tmp_path: Path) -> None:
    """Review 17g: ``pytest.xfail()`` raised in every call: the JUnit parser counted the
    xfails as skips (INCONCLUSIVE) while ``parser: pytest`` counted them as run (PASS)."""
    repo = project(tmp_path, """
        import pytest
        def test_add(): pytest.xfail("later")
        def test_mul(): pytest.xfail("later")
    """)
    for command, parser in ((PYTEST, "junit"), (TEXT, "pytest")):
        report, _, _ = verify(repo, command, parser, run_id=f"r-{parser}")
        assert report.result is Result.INCONCLUSIVE, (parser, report.summary)


def test_an_exit_code_past_the_signals_is_no_signal(tmp_path: Path) -> None:
    report, _, _ = verify(project(tmp_path, "def test_ok(): pass\n"), "exit 255", "generic")
    assert report.result is Result.FAIL and "signal" not in report.summary, report.summary


def test_a_session_ended_after_a_subtest_is_no_pass(tmp_path: Path) -> None:
    """Review 17i: a subtest's report is a call report of its test's node id: a test that
    ran one passing subtest, then ended the session (``pytest.exit(returncode=0)`` in the
    code under test) counted as run to the end of its call, and the session PASSed."""
    repo = project(tmp_path, """
        import pytest
        def mul(a, b):
            if (a, b) == (2, 3):
                pytest.exit("done", returncode=0)
            return a * b + 1
        def test_one(): assert 1 == 1
        def test_mul(subtests):
            with subtests.test("small"):
                assert 3 == 3
            assert mul(2, 3) == 6
    """)
    report, _, _ = verify(repo, WRITER, "junit")
    assert report.result is Result.FAIL, report.summary


@pytest.mark.parametrize("flag", ["--co", "--setup-plan"])
def test_a_session_that_runs_no_call_on_purpose_has_nothing_unfinished(tmp_path: Path,
                                                                       flag: str) -> None:
    """Review 17i: an honest collect-only step read "2 failed: never finished"."""
    repo = project(tmp_path, "def test_a(): pass\ndef test_b(): pass\n")
    report, _, _ = verify(repo, f"{WRITER} {flag}", "junit")
    assert report.result is Result.INCONCLUSIVE and "no test ran" in report.summary, \
        report.summary
