"""What a GitHub Actions runner reads from a step, made safe for hostile text.

A runner reads three channels, and a verifier's output (a report summary, a test name, a
log tail, even a verifier's name in a pull request's ``choir.yaml``) must drive none of them:

- **The log** (stdout and stderr). Every line is parsed for workflow commands: ``::name
  props::data`` at the start of the line after leading white space is trimmed, and the legacy
  ``##[name props]data`` anywhere in it. ``::add-mask::``, ``::set-output``, ``::stop-commands``
  or ``::error`` from a verifier would mask, set outputs, blind the log or forge annotations.
  Hostile text is written only between ``::stop-commands::TOKEN`` and ``::TOKEN::`` with a
  random token, and each of its lines is also defused on its own (a visible, non-blank prefix,
  so no line starts with ``::``; ``##[`` broken up), so neither guard alone holds it
  (``relay``).
- **Annotations** (``::error file=F,line=N,title=T::message``): Choir's own commands, with
  the data escaped as the runner unescapes it (``%``, CR, LF) and the properties too (and
  ``:`` and ``,``), so a value cannot end its field or the line (``annotation``).
- **Files**: ``$GITHUB_OUTPUT`` takes ``name<<DELIMITER`` blocks with a random delimiter and
  refuses a value holding a line break (``write_outputs``); ``$GITHUB_STEP_SUMMARY`` is
  markdown, where hostile text goes only inside HTML blocks, escaped (``choir.ci.summary``).

The parser these escapes answer is actions/runner's ``ActionCommand.TryParseV2`` and
``TryParse`` (src/Runner.Common/ActionCommand.cs) and ``ActionCommandManager``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from choir._core.terminal import plain_lines

RELAY_PREFIX = "│ "
"""Starts every relayed line: not white space, so no relayed line starts with ``::``."""
_DATA = (("%", "%25"), ("\r", "%0D"), ("\n", "%0A"))
_PROPERTY = (*_DATA, (":", "%3A"), (",", "%2C"))
_MESSAGE_MAX = 2000


def defuse(text: str) -> str:
    """Untrusted text as log lines no runner reads as a command."""
    # U+2028/2029 end no line for the runner (.NET ReadLine), but they might for a reader
    lines = plain_lines(text).replace("\u2028", "\n").replace("\u2029", "\n").split("\n")
    return "\n".join(RELAY_PREFIX + line.replace("##[", "#\u2060#[") for line in lines)


def _escape(value: str, table: tuple[tuple[str, str], ...]) -> str:
    for raw, escaped in table:  # "%" first, so an escape is never escaped twice
        value = value.replace(raw, escaped)
    return value


def annotation(level: str, message: str, *, title: str = "", file: str | None = None,
               line: int | None = None) -> str:
    """One ``::error`` (or ``::warning``/``::notice``) command, every field escaped."""
    if level not in ("error", "warning", "notice"):
        raise ValueError(f"not an annotation level: {level}")
    props = []  # the runner trims the properties' ends: values are stripped to round-trip
    file, title = (file or "").strip(), plain_lines(title)[:200].strip()
    if file:
        props.append(f"file={_escape(file, _PROPERTY)}")
        if line is not None and line > 0:
            props.append(f"line={line}")
    if title:
        props.append(f"title={_escape(title, _PROPERTY)}")
    data = _escape(plain_lines(message)[:_MESSAGE_MAX], _DATA)
    return f"::{level}{' ' + ','.join(props) if props else ''}::{data}"


@contextmanager
def stopped(out: TextIO) -> Iterator[None]:
    """Commands off while the block writes: ``::stop-commands::TOKEN`` ... ``::TOKEN::``.

    The token is random per block, so text inside cannot guess it to turn commands back on.
    """
    token = f"choir-{secrets.token_hex(16)}"
    out.write(f"::stop-commands::{token}\n")
    out.flush()
    try:
        yield
    finally:
        out.write(f"::{token}::\n")
        out.flush()


def relay(out: TextIO, lines: Iterable[str]) -> None:
    """Write untrusted ``lines`` to the log: commands stopped, each line defused."""
    with stopped(out):
        for line in lines:
            out.write(defuse(line.rstrip("\n")) + "\n")
            out.flush()


def write_outputs(path: Path, values: Mapping[str, str | list[str]]) -> None:
    """Append step outputs to ``$GITHUB_OUTPUT``; a list becomes a multi-line value.

    Raises:
        ValueError: a name is not a plain identifier, or a value holds a line break (a
            list's items may not either) or the delimiter.
    """
    delimiter = f"choir_{secrets.token_hex(16)}"
    blocks = []
    for name, value in values.items():
        items = value if isinstance(value, list) else [value]
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"not an output name: {name!r}")
        if any("\n" in v or "\r" in v or delimiter in v for v in items):
            raise ValueError(f"output {name}: a value may not hold a line break")
        blocks.append(f"{name}<<{delimiter}\n" + "".join(f"{v}\n" for v in items)
                      + f"{delimiter}\n")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(blocks))
