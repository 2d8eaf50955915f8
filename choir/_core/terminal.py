"""Untrusted text made safe for a terminal: one helper for every place that renders it.

Logs, file names, report summaries and configuration values are written by the code under
verification. On a terminal, escape sequences in them act: OSC 52 writes the clipboard, CSI
clears the screen or moves the cursor over earlier output, OSC 8 plants links, bidi controls
reorder what is shown; and rich markup in them would style or link text. So: strip escape
sequences and every other C0/C1 control (keeping newline and tab) and bidi controls, and
escape rich markup where the text is rendered by rich.
"""

from __future__ import annotations

import re

_SEQUENCES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI ... final byte
    r"|\x1b[\]PX^_].*?(?:\x07|\x1b\\|\x9c|$)"  # OSC, DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]"  # two-byte and nF escapes
    r"|[\x9d\x90\x98\x9e\x9f].*?(?:\x07|\x1b\\|\x9c|$)"  # 8-bit string introducers
    r"|\x9b[0-?]*[ -/]*[@-~]",  # 8-bit CSI
    re.DOTALL,
)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def strip_controls(text: str) -> str:
    """``text`` without escape sequences, control characters (but ``\\n`` and ``\\t``) or
    bidi controls, and with lone surrogates (a file name's bytes that are not UTF-8, carried
    in a ``str``) as ``\\udcNN``: a file or a terminal that takes UTF-8 takes the result."""
    return utf8(_CONTROLS.sub("", _SEQUENCES.sub("", text)))


def utf8(text: str) -> str:
    """``text`` with lone surrogates as ``\\udcNN``: what any UTF-8 file or store takes."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def safe_markup(text: str) -> str:
    """``text`` stripped of controls and with rich markup escaped, for a rich renderable."""
    from rich.markup import escape

    return escape(strip_controls(text))


def shorten(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, cut at a word boundary with an ellipsis: a
    summary cut mid-word ("test_ad") reads as a different name."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = head.rfind(" ")
    if space >= limit // 2:  # a very long word is cut where it must be
        head = head[:space]
    return head.rstrip(" ,;:") + "…"


def plain_lines(text: str) -> str:
    """``strip_controls`` with carriage returns made newlines, so a line a progress bar
    overwrote still shows: the form of a log tail handed to a person or another program."""
    return strip_controls(text.replace("\r\n", "\n").replace("\r", "\n"))


def one_line(value: object, limit: int = 300) -> str:
    """Untrusted ``value`` as one short line of plain text (controls stripped, white space
    folded, ``shorten``ed): a CI log or summary line, a table cell."""
    return shorten(" ".join(plain_lines(str(value)).split()), limit)
