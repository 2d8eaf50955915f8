"""Reports from real tool output: verdicts from evidence, bounded size, stable signatures."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choir.evidence.artifacts import ArtifactStore
from choir.models import Result, StepSpec, Target, VerifierKind, VerifierSpec
from choir.report import abuild_report, signature_id
from choir.sandbox import get_sandbox
from choir.verification.pipeline import run_verifier
from tests.workitems import NO_PLUGINS

PY = sys.executable


def verify(repo: Path, command: str, parser: str, run_id: str = "r",
           reporter: str | None = None, kind: VerifierKind = VerifierKind.UNIT_TESTS):  # type: ignore[no-untyped-def]
    spec = VerifierSpec(name="v", kind=kind, parser=parser, timeout_s=120,
                        steps=(StepSpec(name="run", command=command),))
    store = ArtifactStore()
    target = Target(tree_hash="0" * 64)
    result = run_verifier(spec, repo=repo, sandbox=get_sandbox("local"), store=store,
                          run_id=run_id, target=target)
    report = asyncio.run(abuild_report(result, spec=spec, store=store, target=target,
                                       reporter=reporter, deadline_s=30))
    return report, result, store


def project(tmp_path: Path, body: str) -> Path:
    repo = tmp_path / "proj"
    repo.mkdir(exist_ok=True)
    (repo / "test_x.py").write_text(textwrap.dedent(body))
    return repo


PYTEST = f"{NO_PLUGINS} {PY} -m pytest -q -p no:cacheprovider --junitxml=$CHOIR_OUT/junit.xml"


def test_junit_from_real_pytest(tmp_path: Path) -> None:
    repo = project(tmp_path, """
        import pytest
        def test_ok(): assert True
        def test_bad(): assert 1 + 1 == 3
        def test_err(): raise RuntimeError("boom")
        @pytest.mark.skip(reason="later")
        def test_skip(): pass
    """)
    report, _, _ = verify(repo, PYTEST, "junit")
    assert report.result is Result.FAIL
    assert (report.counts.run, report.counts.failed, report.counts.skipped) == (4, 2, 1)
    ids = {s.test_id for s in report.failure_signatures}
    # the form pytest takes on its command line, not JUnit's dotted one (test_x::test_bad)
    assert ids == {"test_x.py::test_bad", "test_x.py::test_err"}
    assert all(s.citation and s.citation.span_hash for s in report.failure_signatures)


@pytest.mark.parametrize("family", ["xunit1", "xunit2"])
def test_junit_ids_paste_into_pytest_and_cite_the_failing_line(tmp_path: Path,
                                                               family: str) -> None:
    repo = project(tmp_path, "")
    (repo / "test_x.py").unlink()
    (repo / "tests").mkdir()
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_m.py").write_text(textwrap.dedent("""\
        class TestA:
            def test_x(self):
                value = 1
                assert value == 2


        def test_y():
            assert 0
        """))
    report, _, store = verify(repo, f"{PYTEST} -o junit_family={family}", "junit")
    by_id = {s.test_id: s for s in report.failure_signatures}
    assert set(by_id) == {"tests/test_m.py::TestA::test_x", "tests/test_m.py::test_y"}
    pasted = __import__("subprocess").run(
        [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *sorted(by_id)], cwd=repo,
        capture_output=True, text=True,  # this venv's plugins (5 s to load here) not needed
        env={**__import__("os").environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "2 failed" in pasted.stdout, pasted.stdout  # both ids select their test
    first = by_id["tests/test_m.py::TestA::test_x"]
    assert first.location == "tests/test_m.py:4"  # the assert, not the def
    cited = store.read_bytes(first.citation.artifact).decode().splitlines()
    line = cited[first.citation.line_start - 1]
    assert line.startswith("E ") and "assert 1 == 2" in line  # not the ___ header


def test_pytest_text_fallback(tmp_path: Path) -> None:
    repo = project(tmp_path, "def test_a(): assert False\ndef test_b(): pass\n")
    report, _, _ = verify(repo, f"{NO_PLUGINS} {PY} -m pytest -q -rA -p no:cacheprovider", "pytest")
    assert report.result is Result.FAIL and report.counts.failed == 1
    assert [s.test_id for s in report.failure_signatures] == ["test_x.py::test_a"]


def test_ruff_json_from_real_ruff(tmp_path: Path) -> None:
    repo = project(tmp_path, "import os\nimport sys\nx = 1\n")
    ruff = str(Path(PY).parent / "ruff")
    command = f"{ruff} check --no-cache --isolated --select F --output-format json ."
    report, _, _ = verify(repo, command, "ruff",
                          kind=VerifierKind.LINT)
    assert report.result is Result.FAIL and report.counts.failed == 2
    assert {s.test_id for s in report.failure_signatures} == {"F401"}


def test_mypy_from_real_mypy(tmp_path: Path) -> None:
    repo = project(tmp_path, "def f(x: int) -> str:\n    return x\n")
    report, _, _ = verify(repo, f"{PY} -m mypy --no-incremental --cache-dir=$TMPDIR test_x.py",
                          "mypy", kind=VerifierKind.TYPECHECK)
    assert report.result is Result.FAIL and report.counts.failed == 1
    assert report.failure_signatures[0].test_id == "return-value"


def test_missing_junit_on_success_is_inconclusive_never_pass(tmp_path: Path) -> None:
    repo = project(tmp_path, "def test_ok(): pass\n")
    report, _, _ = verify(repo, "true", "junit")
    assert report.result is Result.INCONCLUSIVE


def test_parser_failures_with_exit_zero_still_fail(tmp_path: Path) -> None:
    repo = project(tmp_path, "def test_bad(): assert False\n")
    report, _, _ = verify(repo, f"{PYTEST} || true", "junit")
    assert report.result is Result.FAIL


@pytest.mark.parametrize("before", ["", "<!-- " + "x" * 5000 + " -->"])
def test_hostile_junit_with_entities_is_refused(tmp_path: Path, before: str) -> None:
    """A DTD is refused wherever it stands: the check looked at the first 4 KiB only, and
    behind a longer comment expat expanded the entities in Choir's own process (a review
    measured 154 MiB for a 2 MiB file) and the run PASSed (failing on the old code)."""
    repo = project(tmp_path, "")
    xml = (f'<?xml version="1.0"?>{before}<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">'
           '<!ENTITY b "&a;&a;&a;&a;&a;&a;">]><testsuite><testcase name="t">'
           '<system-out>&b;</system-out></testcase></testsuite>')
    (repo / "j.xml").write_text(xml)
    report, _, _ = verify(repo, "cp j.xml $CHOIR_OUT/junit.xml", "junit")
    assert report.result is Result.INCONCLUSIVE


def test_a_failure_after_a_testcase_nested_in_another_is_never_dropped(tmp_path: Path) -> None:
    """The parser kept one open ``<testcase>``: a ``<testcase>`` inside another closed it, and
    the outer case's ``<failure>`` after it counted nowhere, so a step that exits 0 PASSed with
    a failure in its XML (review 19a; failing on the old code). Such a file is refused."""
    repo = project(tmp_path, "")
    xml = ('<?xml version="1.0"?><testsuite><testcase classname="t" name="a">'
           '<testcase classname="t" name="b"/><failure message="boom">x</failure>'
           '</testcase></testsuite>')
    (repo / "j.xml").write_text(xml)
    report, _, _ = verify(repo, "cp j.xml $CHOIR_OUT/junit.xml", "junit")
    assert report.result is not Result.PASS


@pytest.mark.parametrize("size", [1 << 10, 1 << 20, 20 << 20])
def test_report_stays_under_4kb_whatever_the_log(tmp_path: Path, size: int) -> None:
    repo = project(tmp_path, "")
    cmd = (f"{PY} -c \"import sys\nfor i in range({size // 64}): "
           f"print(f'ERROR failure number {{i}} at 0x{{i:08x}} ' + 'x' * 30)\"; exit 1")
    report, _, _ = verify(repo, cmd, "generic", run_id=f"s{size}")
    assert report.result is Result.FAIL
    assert len(json.dumps(report.model_dump(mode="json"))) < 4096


NOISE = st.sampled_from([
    "/tmp/pytest-of-root/pytest-{n}/test_x0/mod.py", "0x7f{n:x}a0", "2026-11-22T13:{m:02d}:00Z",
    "took {n}.5s", "127.0.0.1:{p}", "uuid 123e4567-e89b-12d3-a456-{n:012d}",
])


@settings(max_examples=60, deadline=None)
@given(template=NOISE, a=st.integers(0, 9999), b=st.integers(0, 9999))
def test_same_failure_with_different_noise_has_same_signature(template: str, a: int,
                                                              b: int) -> None:
    def msg(n: int) -> str:
        return "AssertionError at " + template.format(n=n, m=n % 60, p=1024 + n)

    assert signature_id("test", "t::a", "t.py", msg(a)) == signature_id("test", "t::a", "t.py",
                                                                        msg(b))


@settings(max_examples=60, deadline=None)
@given(a=st.from_regex(r"test_[a-z]{1,12}", fullmatch=True),
       b=st.from_regex(r"test_[a-z]{1,12}", fullmatch=True))
def test_different_tests_have_different_signatures(a: str, b: str) -> None:
    same = signature_id("test", a, "t.py", "assert x") == signature_id("test", b, "t.py",
                                                                       "assert x")
    assert same == (a == b)


def test_different_messages_have_different_signatures() -> None:
    assert signature_id("test", "t", None, "assert 1 == 2") != signature_id(
        "test", "t", None, "KeyError: 'user'")


@pytest.mark.parametrize("bad", ["too-large", "malformed"])
def test_a_sarif_file_that_cannot_be_read_is_never_skipped(tmp_path: Path, bad: str) -> None:
    """A SARIF file over the 8 MiB read bound (a scanner with many findings) or malformed
    was skipped without a word, and a clean second file decided: the run PASSed with its
    findings unread (a review's note, failing on the old code). Unread evidence makes the
    run INCONCLUSIVE, naming the file."""
    repo = project(tmp_path, "")
    finding = {"ruleId": "B105", "message": {"text": "hardcoded password " + "x" * 200}}
    results = [finding] * (45_000 if bad == "too-large" else 1)
    text = json.dumps({"version": "2.1.0", "runs": [{"results": results}]})
    (repo / "big.sarif").write_text(text if bad == "too-large" else text[:-10])
    (repo / "clean.sarif").write_text(json.dumps({"version": "2.1.0",
                                                  "runs": [{"results": []}]}))
    report, _, _ = verify(repo, "cp big.sarif clean.sarif $CHOIR_OUT/", "sarif",
                          kind=VerifierKind.STATIC_ANALYSIS)
    assert report.result is Result.INCONCLUSIVE, report.summary
    assert "big.sarif" in report.summary, report.summary


def test_sarif_from_real_ruff(tmp_path: Path) -> None:
    repo = project(tmp_path, "import os\nx = 1\n")
    ruff = str(Path(PY).parent / "ruff")
    report, _, _ = verify(repo, f"{ruff} check --no-cache --isolated --select F --exit-zero "
                          f"--output-format sarif -o $CHOIR_OUT/ruff.sarif .", "sarif",
                          kind=VerifierKind.STATIC_ANALYSIS)
    assert report.result is Result.FAIL  # exit 0, but the SARIF holds a finding
    assert report.counts.failed == 1
    assert report.failure_signatures[0].test_id == "F401"
    assert "test_x.py" in (report.failure_signatures[0].location or "")
