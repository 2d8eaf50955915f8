"""Path globs: ``*``, ``?`` and ``[...]`` stay within a folder, ``**`` crosses folders, and
``glob_match`` (the model's patterns) answers like ``glob_regex`` without backtracking."""

from __future__ import annotations

import re
import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choir._core.globs import glob_match, glob_regex


def test_a_star_stays_in_one_folder() -> None:
    m = glob_match("src/*/test_*.py")
    assert m("src/a/test_x.py") and m("src//test_.py")
    assert not m("src/a/b/test_y.py") and not m("src/test_z.py") and not m("src/a/test_x.pyc")


def test_double_star_slash_is_any_depth_including_none() -> None:
    m = glob_match("src/**/test_*.py")
    assert m("src/test_z.py") and m("src/a/test_x.py") and m("src/a/b/c/test_y.py")
    assert not m("test_z.py") and not m("src/a/b/x_test.py")
    assert glob_match("**/x")("x") and glob_match("**/x")("a/b/x")
    assert glob_match("a/**")("a/b/c") and not glob_match("a/**")("b/a/c")


def test_question_mark_and_classes_match_one_character_never_a_slash() -> None:
    assert glob_match("a?c")("abc") and not glob_match("a?c")("a/c")
    assert not glob_match("a?c")("ac") and not glob_match("a?c")("abbc")
    assert glob_match("f[!x].py")("fy.py") and not glob_match("f[!x].py")("fx.py")
    assert not glob_match("f[!x].py")("f/.py")
    assert glob_match("f[a-c].py")("fb.py") and not glob_match("f[a-c].py")("fd.py")
    assert glob_match("a[/]b")("a[/]b") is False and not glob_match("a[/]b")("a/b")


def test_a_bad_class_is_refused() -> None:
    with pytest.raises(re.error):
        glob_match("f[z-a]")


def test_many_stars_answer_in_linear_time() -> None:
    """Review 20b, F1: ``re`` took 73 s on five stars against 200 characters."""
    start = time.monotonic()
    assert not glob_match("*a" * 5 + "/")("a" * 200)
    assert not glob_match("*a" * 400 + "/")("a" * 4000)
    assert glob_match("**/" + "*a" * 400)("b/" + "a" * 4000)
    assert time.monotonic() - start < 2


@settings(max_examples=400, deadline=None)
@given(st.text("ab/*?[]!-\n", max_size=10), st.text("ab/!-\n", max_size=10))
def test_glob_match_answers_as_the_regex_does(pattern: str, path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ``[a--b]`` is a "possible set difference"
        try:
            regex = re.compile(glob_regex(pattern), re.DOTALL)
        except re.error:
            with pytest.raises(re.error):
                glob_match(pattern)
            return
        assert glob_match(pattern)(path) is (regex.fullmatch(path) is not None)


@pytest.mark.parametrize(("pattern", "path", "matched"), [
    ("[!]?", "[!]x", True), ("[!]?", "a", False),  # no class closes: plain characters
    ("[]a]x", "]x", True), ("[!]a]x", "]x", False), ("[!]a]x", "bx", True),
])
def test_a_bracket_first_in_a_class_is_a_member(pattern: str, path: str, matched: bool) -> None:
    """``[!]?`` was read as the class ``[^]``, which ``re`` cannot compile alone: the
    property test above found it (``glob_match`` raised where the joined regex did not)."""
    assert glob_match(pattern)(path) is matched
    assert (re.fullmatch(glob_regex(pattern), path, re.DOTALL) is not None) is matched
