"""A type error cannot be dressed up as "mypy could not run" (review 23b).

An empty module planted beside the code under the same name made mypy stop at ``Duplicate
module named ...`` with exit 2. That line names a file but no line number, the mypy parser
counted nothing, and ``TOOL_CRASHES`` read exit 2 as a crash: INCONCLUSIVE, so the executor
never heard of its type error. Such errors about the tree are failures now; a mypy that truly
could not run (bad options, a file that is not there) stays INCONCLUSIVE.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.models import Result, VerifierKind
from choir.report.lint import parse_mypy
from choir.report.parsers import COMBINED, ParseInput
from tests.unit.report.test_report_pipeline import PY, project, verify

MYPY = f"{Path(PY).parent / 'mypy'} --cache-dir=/dev/null --no-error-summary --show-error-codes"


def _plant(repo: Path, how: str) -> None:
    (repo / "pkg").mkdir()
    (repo / "pkg" / "m.py").write_text('x: int = "not an int"\n')
    if how == "duplicate":  # the same module name twice: mypy stops before checking
        (repo / "other").mkdir()
        (repo / "other" / "m.py").write_text("\n")
    elif how == "bad_package":  # a folder with __init__.py that no import can name
        (repo / "not-a-name").mkdir()
        (repo / "not-a-name" / "__init__.py").write_text("")


@pytest.mark.parametrize("how", ["duplicate", "bad_package"])
def test_a_planted_file_that_stops_mypy_is_a_fail(tmp_path: Path, how: str) -> None:
    repo = project(tmp_path, "x = 1\n")
    _plant(repo, how)
    report, result, _ = verify(repo, f"{MYPY} .", "mypy", kind=VerifierKind.TYPECHECK)
    assert result.manifest.commands_executed[0].exit_code == 2
    assert report.result is Result.FAIL, report.summary
    assert (report.counts.failed or 0) >= 1 and report.failure_signatures


def test_a_mypy_that_could_not_read_its_file_stays_inconclusive(tmp_path: Path) -> None:
    repo = project(tmp_path, "x = 1\n")
    report, _, _ = verify(repo, f"{MYPY} no_such_file.py", "mypy", kind=VerifierKind.TYPECHECK)
    assert report.result is Result.INCONCLUSIVE, report.summary
    assert "mypy could not run (exit 2)" in report.summary


@pytest.mark.parametrize(("line", "failures"), [
    ('pkg/m.py: error: Duplicate module named "m" (also at "./other/m.py")', 1),
    ("pkg/m.py: error: Source file found twice under different module names: "
     '"m" and "pkg.m"', 1),
    ("not-a-name contains __init__.py but is not a valid Python package name", 1),
    ("pkg/m.py:1: error: Incompatible types in assignment  [assignment]", 1),
    ("pkg/m.py: note: See https://mypy.readthedocs.io/ for more info", 0),
    ("nosuch.py: error: Cannot read file: No such file or directory", 0),
    ("mypy: error: unrecognized arguments: --bogus", 0),
    ("mypy: can't read file 'x.py': No such file or directory", 0),
    ("There are no .py[i] files in directory '.'", 0),
])
def test_the_mypy_parser_counts_errors_about_files_without_a_line(line: str,
                                                                 failures: int) -> None:
    store = ArtifactStore()
    inp = ParseInput(artifacts={COMBINED: store.ingest_bytes(f"{line}\n".encode())},
                     store=store, exit_codes=[2])
    parsed = parse_mypy(inp)
    assert parsed.counts.failed == failures
    assert len(parsed.signatures) == failures
