"""Mutants of the changed lines: which lines, which swaps, how many."""

from __future__ import annotations

from pathlib import Path

from choir.director.mutation import (
    changed_lines,
    judge,
    mutant_tree,
    mutants,
    null_mutant,
    verdict,
)
from choir.evidence.tree import remove_snapshot
from choir.models import Counts, FailureSignature, Result, Target, VerificationReport


def test_changed_lines_are_the_replaced_and_inserted_lines_of_the_new_file() -> None:
    old = "a = 1\nb = 2\nc = 3\n"
    new = "a = 1\nb = 5\nc = 3\nd = 4\n"
    assert changed_lines(old, new) == [2, 4]
    assert changed_lines("", "x = 1\n") == [1]
    assert changed_lines(new, new) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_swaps_touch_operators_constants_and_returns_never_strings_or_comments(
        tmp_path: Path) -> None:
    tree = _tree(tmp_path, {"calc.py": 'def f(a, b):\n    return a + b == 2  # a - b "<"\n',
                            "tests/test_calc.py": "assert 1 + 1 == 2\n"})
    base = {"calc.py": "x"}
    found, total = mutants(tree, base, lambda _rel: "def f(a, b):\n    return a - b\n",
                           lambda rel: rel.startswith("tests/"), 20)
    labels = [m.label() for m in found]
    assert labels == ["calc.py:2 '+' -> '-'", "calc.py:2 '==' -> '!='",
                      "calc.py:2 '2' -> '3'",
                      "calc.py:2 'return a + b == 2  # a - b \"<\"' -> 'return None'"]
    assert total == 4  # the spec (tests/) is never mutated; the comment's '-' and '<' neither
    assert "return a - b == 2" in found[0].source


def test_the_bound_spreads_over_lines_first_and_the_order_is_deterministic(
        tmp_path: Path) -> None:
    tree = _tree(tmp_path, {"m.py": "a = 1 + 2\nb = 3 - 4\nc = 5 < 6\n"})
    first, total = mutants(tree, {}, lambda _r: "", lambda _r: False, 3)
    again, _ = mutants(tree, {}, lambda _r: "", lambda _r: False, 3)
    assert [m.label() for m in first] == [m.label() for m in again]
    assert [m.line for m in first] == [1, 2, 3] and total == 9


def test_a_mutant_is_a_private_read_only_copy(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "t", {"m.py": "a = 1 + 2\n", "pkg/n.py": "x = 1\n"})
    [m, *_] = mutants(tree, {}, lambda _r: "", lambda _r: False, 1)[0]
    copy = mutant_tree(tree, m, tmp_path)
    assert (copy / "m.py").read_text() == "a = 2 + 2\n"
    assert (tree / "m.py").read_text() == "a = 1 + 2\n"
    assert not (copy / "m.py").stat().st_mode & 0o222
    assert not (copy / "pkg").stat().st_mode & 0o222
    remove_snapshot(copy)


def test_survivors_fail_or_stay_inconclusive_by_policy() -> None:
    assert verdict(3, [], 0, "fail") is Result.PASS
    assert verdict(2, ["m.py:1"], 0, "fail") is Result.FAIL
    assert verdict(2, ["m.py:1"], 0, "inconclusive") is Result.INCONCLUSIVE
    assert verdict(2, [], 1, "fail") is Result.INCONCLUSIVE
    assert verdict(0, [], 0, "fail") is Result.PASS  # nothing changed to mutate
    assert verdict(0, [], 0, "fail", skipped=1) is Result.INCONCLUSIVE  # not looked at
    assert verdict(3, [], 0, "fail", tricked=True) is Result.INCONCLUSIVE


def test_a_swap_that_no_longer_parses_is_no_mutant(tmp_path: Path) -> None:
    # '*' -> '/' in '*args' and 'in' -> 'not in' in a for loop are syntax errors: an import
    # error kills nothing, so they would only make the check inconclusive
    tree = _tree(tmp_path, {"m.py": "def f(*args):\n    for a in args:\n        yield a\n"})
    found, total = mutants(tree, {}, lambda _r: "", lambda _r: False, 20)
    assert found == [] and total == 2


def _said(result: Result, run: int | None, failed: int | None, errors: int | None = 0,
          line: str = "") -> VerificationReport:
    said = (FailureSignature(id="g", kind="exit_code", excerpt=line),) if line else ()
    return VerificationReport(verifier="u", verifier_type="unit_tests",
                              target=Target(tree_hash="0" * 64), result=result, summary="s",
                              next_actions=("a",), confidence=1.0, failure_signatures=said,
                              counts=Counts(run=run, failed=failed, errors=errors))


def test_only_a_failing_test_kills_a_mutant() -> None:
    assert judge(_said(Result.FAIL, 3, 1), 3) == "killed"
    assert judge(_said(Result.PASS, 3, 0), 3) == "survived"
    assert judge(_said(Result.FAIL, 0, 0, errors=1), 3) == "unknown"  # collection error
    assert judge(_said(Result.FAIL, 3, 3), 3) == "unknown"  # every test at once
    assert judge(_said(Result.FAIL, 3, 2, errors=1), 3) == "unknown"
    # a parser that counts no tests (generic): its last error lines tell an import error
    assert judge(_said(Result.FAIL, None, None), None) == "killed"
    for line in ("Interrupted: 1 error during collection", "E   ImportError: not the tree"):
        assert judge(_said(Result.FAIL, None, None, line=line), None) == "unknown"
    assert judge(_said(Result.INCONCLUSIVE, 3, 1), 3) == "unknown"
    assert judge(_said(Result.FAIL, 1, 1), 1) == "killed"  # one test: it is the test


def test_the_null_mutant_adds_a_statement_and_changes_nothing_else(tmp_path: Path) -> None:
    tree = _tree(tmp_path, {"m.py": "a = 1\n# last, no newline"})
    null = null_mutant(tree, "m.py")
    assert null.source == "a = 1\n# last, no newline\npass\n" and null.line == 3
