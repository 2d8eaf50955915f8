"""The mutation check against code that tries to pass it: review 22a.

Each test runs the real check (``run_mutation``) on a small tree with a fake runner standing
in for the sandbox: what the runner says of a tree is what hostile or honest code under test
would make pytest say. F1: code that tells a mutant from the real tree (its path, a hash of
its own source) and breaks at import killed every mutant, so the check PASSed an untested
change. F2: a changed module over ``MAX_FILE`` or behind a symlink was never mutated, and
"nothing to mutate" PASSed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from choir.config.policy import load_policy, with_run_checks
from choir.director.mutation import MAX_FILE, run_mutation
from choir.director.rounds import Round
from choir.evidence.spec import pin_spec
from choir.evidence.tree import inspect_tree
from choir.models import (
    Counts,
    Mood,
    PlannedVerifier,
    Result,
    Target,
    VerificationReport,
    VerifierSpec,
)
from choir.models.run import VerifierRun
from tests.unit.director.test_director_adjudicate import repo_config

YAML = ("verifiers:\n  unit:\n    kind: unit_tests\n    parser: junit\n"
        "    steps: [{name: test, command: pytest -q}]\n")
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
HELPER = FIXED + "def double(x):\n    return x * 2\n"  # double: no test calls it
# what pytest reports on a tree: a test failed (1 of 2), an import error at collection, all
PASSED, FAILED, IMPORT_ERROR, ALL_FAILED = (
    (Result.PASS, Counts(run=2, failed=0, errors=0)),
    (Result.FAIL, Counts(run=2, failed=1, errors=0)),
    (Result.FAIL, Counts(run=0, failed=0, errors=1)),
    (Result.FAIL, Counts(run=2, failed=2, errors=0)))
Outcome = tuple[Result, Counts]


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _check(tmp_path: Path, files: dict[str, str], judge: Callable[[Path], Outcome],
           links: dict[str, str] | None = None, base_extra: dict[str, str] | None = None,
           ) -> tuple[VerificationReport, list[Path]]:
    """``run_mutation`` on ``files`` (plus ``links``: name -> target) against a base tree of
    ``calc.py`` = BUGGY; ``judge`` says what the tests report on each tree it is given."""
    base = _write(tmp_path / "base", {"calc.py": BUGGY, "tests/test_calc.py": "x = 1\n",
                                      **(base_extra or {})})
    tree = _write(tmp_path / "tree", {"tests/test_calc.py": "x = 1\n", **files})
    for name, target in (links or {}).items():
        os.symlink(target, tree / name)
    config = with_run_checks(repo_config(tmp_path / "cfg", YAML))
    (tmp_path / "pins").mkdir()
    rnd = Round(id="r1", config=config, policy=load_policy(config), mood=Mood.BOLD,
                target=Target(tree_hash=inspect_tree(tree).tree_hash), tree=tree,
                base=pin_spec(base, ("*.py",), tmp_path / "pins"))
    seen: list[Path] = []

    async def run_one(spec: VerifierSpec, planned: PlannedVerifier, run_id: str, at: Path,
                      target: Target) -> tuple[VerifierRun, None]:
        seen.append(at)
        result, counts = judge(at)
        report = VerificationReport(verifier=planned.name, verifier_type="unit_tests",
                                    target=target, result=result, summary="ran",
                                    next_actions=("look",), confidence=1.0, counts=counts)
        return VerifierRun(verifier=planned.name, run_id=run_id, report=report,
                           report_hash="0" * 64, manifest_hash="0" * 64, lens="mutant"), None

    spec = config.verifiers["unit.mutants"]
    run = asyncio.run(run_mutation(rnd, spec, PlannedVerifier(name="unit.mutants"),
                                   f"r1-m{secrets.token_hex(4)}",
                                   "fake", run_one))
    return run.report, seen


def _honest(source: str) -> Callable[[Path], Outcome]:
    """Tests that test ``add`` alone: a mutant of ``add`` fails one of the two tests."""
    def judge(tree: Path) -> Outcome:
        text = (tree / "calc.py").read_text()
        return PASSED if text.startswith(FIXED) or text.startswith(source) else FAILED
    return judge


def test_code_that_tells_a_mutant_from_the_tree_is_inconclusive(tmp_path: Path) -> None:
    # the code under test hashes its own source: any change to it, and it raises at import
    def judge(tree: Path) -> Outcome:
        return PASSED if (tree / "calc.py").read_text() == HELPER else IMPORT_ERROR
    report, seen = _check(tmp_path, {"calc.py": HELPER}, judge)
    assert report.result is Result.INCONCLUSIVE, report.summary
    assert "tells a mutant from the tree" in report.summary
    assert len(seen) == 1  # the null mutant failed: no real mutant is worth running
    assert all(".mutant-" not in str(path) for path in seen)  # no name gives the copy away


def test_an_import_error_or_every_test_failing_is_no_kill(tmp_path: Path) -> None:
    # the null mutant passes (a hash that ignores it), every real mutant breaks the import
    for k, broken in enumerate((IMPORT_ERROR, ALL_FAILED)):
        def judge(tree: Path, broken: Outcome = broken) -> Outcome:
            text = (tree / "calc.py").read_text()
            return PASSED if text.startswith(HELPER) else broken
        report, seen = _check(tmp_path / str(k), {"calc.py": HELPER}, judge)
        assert report.result is Result.INCONCLUSIVE, report.summary
        assert report.summary.startswith("0 of 5 mutants"), report.summary
        assert "5 told nothing" in report.summary and report.counts.errors == 5
        assert len(seen) == 6  # the null mutant, then the five real ones


def test_a_test_that_fails_is_a_kill_and_an_untested_line_survives(tmp_path: Path) -> None:
    report, _ = _check(tmp_path / "a", {"calc.py": FIXED}, _honest(FIXED))
    assert report.result is Result.PASS, report.summary
    assert report.counts.run == 2  # '+' -> '-', return None: the null mutant is not counted
    report, _ = _check(tmp_path / "b", {"calc.py": HELPER}, _honest(FIXED))
    assert report.result is Result.FAIL and report.counts.failed == 3, report.summary


def test_a_changed_file_too_large_to_mutate_is_never_a_pass(tmp_path: Path) -> None:
    big = HELPER + ("#" * 99 + "\n") * (MAX_FILE // 100 + 1)
    report, seen = _check(tmp_path, {"calc.py": big}, _honest(FIXED))
    assert report.result is Result.INCONCLUSIVE, report.summary
    assert "calc.py" in report.summary and "too large" in report.summary
    # an unchanged large file is no reason to doubt the change
    report, _ = _check(tmp_path / "same", {"calc.py": FIXED, "big.py": big}, _honest(FIXED),
                       base_extra={"big.py": big})
    assert report.result is Result.PASS, report.summary


def test_a_module_behind_a_link_is_mutated_through_it(tmp_path: Path) -> None:
    # calc.py is a link to a file not named .py: its target's changed lines are mutated
    report, seen = _check(tmp_path, {"calc_impl": HELPER}, _honest(FIXED),
                          links={"calc.py": "calc_impl"})
    assert report.result is Result.FAIL, report.summary
    assert "calc_impl:4 '*' -> '/'" in report.summary


def test_a_link_out_of_the_tree_is_never_a_pass(tmp_path: Path) -> None:
    outside = _write(tmp_path / "elsewhere", {"impl.py": HELPER}) / "impl.py"
    report, _ = _check(tmp_path, {}, _honest(FIXED), links={"calc.py": str(outside)})
    assert report.result is Result.INCONCLUSIVE, report.summary
    assert "calc.py" in report.summary and "out of the tree" in report.summary
