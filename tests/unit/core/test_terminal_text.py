"""Text shown to people: cut at words, and log tails free of terminal sequences."""

from __future__ import annotations

from choir._core.terminal import plain_lines, shorten


def test_shorten_cuts_at_a_word_and_marks_the_cut() -> None:
    text = "unit: FAIL: 1 of 2 tests failed: test_add_zero_returns_zero in tests/test_calc.py"
    cut = shorten(text, 50)
    assert len(cut) <= 50 and cut.endswith("…")
    assert cut[:-1] == text[: len(cut) - 1]  # a prefix of the text
    assert not text[len(cut) - 1].isalnum()  # ... that ends where a word ended
    assert shorten("short", 50) == "short"
    assert len(shorten("x" * 500, 50)) == 50  # one long word is cut where it must be


def test_plain_lines_drop_ansi_and_keep_overwritten_lines() -> None:
    assert plain_lines("\x1b[31mred\x1b[0m\rdone\r\nnext") == "red\ndone\nnext"
