"""What a GitHub Actions runner makes of a step: its workflow commands, outputs and summary.

``commands`` ports the runner's parsing (actions/runner: ``ActionCommand.TryParseV2``, the
legacy ``TryParse``, and ``ActionCommandManager``'s stop-commands handling), so a test can
ask which commands a step's log would have run. ``outputs`` reads ``$GITHUB_OUTPUT``'s
``name<<DELIMITER`` blocks as the runner does. ``summary_tags`` renders the step summary as
markdown (CommonMark with tables, raw HTML on, like GitHub's renderer before sanitising) and
lists the HTML tags it produced.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

# the commands a runner registers (src/Runner.Worker/*CommandExtension.cs)
REGISTERED = {"add-mask", "set-output", "set-env", "add-path", "save-state", "error",
              "warning", "notice", "debug", "group", "endgroup", "echo", "add-matcher",
              "remove-matcher", "stop-commands"}
_DATA = (("%0D", "\r"), ("%0A", "\n"), ("%25", "%"))
_PROPERTY = (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%"))
_LEGACY = (("%3B", ";"), ("%0D", "\r"), ("%0A", "\n"), ("%5D", "]"), ("%25", "%"))

Command = tuple[str, dict[str, str], str]


def _unescape(value: str, table: tuple[tuple[str, str], ...]) -> str:
    for escaped, raw in table:
        value = value.replace(escaped, raw)
    return value


def _props(text: str, sep: str, table: tuple[tuple[str, str], ...]) -> dict[str, str]:
    found = {}
    for item in (p for p in text.split(sep) if p):
        pair = [p for p in item.split("=", 1) if p]
        if len(pair) == 2:
            found[pair[0]] = _unescape(pair[1], table)
    return found


def _v2(line: str, registered: set[str]) -> Command | None:
    message = line.lstrip()  # .NET TrimStart: every Unicode white space
    if not message.startswith("::"):
        return None
    end = message.find("::", 2)
    if end < 0:
        return None
    info = message[2:end]
    name = info.split(" ", 1)[0]
    if name.lower() not in registered:
        return None
    props = _props(info.split(" ", 1)[1].strip(), ",", _PROPERTY) if " " in info else {}
    return name.lower(), props, _unescape(message[end + 2:], _DATA)


def _legacy(line: str, registered: set[str]) -> Command | None:
    start = line.find("##[")
    if start < 0:
        return None
    end = line.find("]", start)
    if end < 0:
        return None
    info = line[start + 3:end]
    name = info.split(" ", 1)[0]
    if name.lower() not in registered:
        return None
    props = _props(info.split(" ", 1)[1], ";", _LEGACY) if " " in info else {}
    return name.lower(), props, _unescape(line[end + 1:], _LEGACY)


def commands(log: str) -> list[Command]:
    """The workflow commands a runner would process from ``log``, in order."""
    registered = set(REGISTERED)
    token: str | None = None
    done: list[Command] = []
    for line in re.split(r"\r\n|\r|\n", log):
        cmd = _v2(line, registered) or _legacy(line, registered)
        if cmd is None:
            continue
        name, _, data = cmd
        if token is not None:
            if name == token.lower():
                registered.discard(token.lower())
                token = None
            continue
        if name == "stop-commands":
            token = data
            registered.add(data.lower())
            continue
        done.append(cmd)
    return done


def outputs(path: Path) -> dict[str, str]:
    """``$GITHUB_OUTPUT`` as the runner reads it (``name<<DELIM`` blocks, ``name=value``)."""
    found: dict[str, str] = {}
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, i + 1)
            found[name] = "\n".join(lines[i + 1:end])
            i = end + 1
            continue
        if "=" in line:
            name, value = line.split("=", 1)
            found[name] = value
        i += 1
    return found


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def summary_tags(markdown: str) -> tuple[list[tuple[str, dict[str, str | None]]], str]:
    """The HTML tags (with attributes) the summary renders to, and its text."""
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)
    parser = _Tags()
    parser.feed(rendered)
    return parser.tags, "".join(parser.text)
