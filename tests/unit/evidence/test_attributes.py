"""``.gitattributes`` as git reads it: what the plan driver compares an item's lines by.

The driver fails an item whose conversion lines (how a checkout or ``git archive`` changes
a file's bytes) differ from its base's; the lines are split and compared as git's attr.c
reads them, or an item slips a conversion past the check (reviews found each case).
"""

from __future__ import annotations

from choir.evidence.tree import attribute_macros, conversion_lines


def test_lines_end_at_line_feeds_only_and_words_at_gits_blanks() -> None:
    assert conversion_lines(b"b.txt\rtext\reol=crlf\n")  # one line of three words to git
    assert conversion_lines(b"\x0c#lib.sh text eol=crlf\n")  # a pattern, not a comment
    assert not conversion_lines(b"# b.txt eol=crlf\n  # x text\n")
    assert conversion_lines(b"\xef\xbb\xbf[attr]conv ident\n") == ("[attr]conv ident",)


def test_the_order_and_a_quoted_patterns_blanks_are_part_of_the_lines() -> None:
    swapped = (conversion_lines(b"* text=auto eol=crlf\n*.sh text eol=lf\n"),
               conversion_lines(b"*.sh text eol=lf\n* text=auto eol=crlf\n"))
    assert swapped[0] != swapped[1]
    assert conversion_lines(b'"a  b.txt" eol=crlf\n') != conversion_lines(b'"a b.txt" eol=crlf\n')


def test_archives_and_macros_count() -> None:
    assert conversion_lines(b"a.txt export-subst\n") and conversion_lines(b"t export-ignore\n")
    macros = attribute_macros(b"[attr]conv ident\n")
    assert conversion_lines(b"v.txt conv\n", macros) and not conversion_lines(b"v.txt conv\n")
    assert not conversion_lines(b"*.png -diff linguist-generated\n")
