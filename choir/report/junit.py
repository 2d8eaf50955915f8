"""JUnit XML (pytest ``--junitxml`` and any JUnit producer), read streaming and defensively."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from choir.models import Citation, Counts, FailureSignature
from choir.report.parsers import (
    COMBINED,
    ParseInput,
    ParseResult,
    _cite,
    _excerpt,
    _find_line,
    _lines,
    parse_generic,
)
from choir.report.signatures import signature_id

_CHUNK = 64 << 10
_TEXT_MAX = 64 << 10  # of a failure's text kept to cite (a message is cut at 2,000 anyway)
_PROBLEMS = ("failure", "error")


class _Refused(ValueError):
    """A file the report will not read: a DTD wherever it stands, or a ``<testcase>`` inside
    another (one case is open at a time: the outer one's failure after it would count
    nowhere)."""


@dataclass
class _Case:
    """One ``<testcase>`` as the parser meets it: its attributes, how many of each problem
    it holds, and the first problem's attributes and (bounded) text."""

    attrib: dict[str, str]
    counts: dict[str, int] = field(default_factory=dict)
    problem: str = ""
    problem_attrib: dict[str, str] = field(default_factory=dict)
    text: list[str] = field(default_factory=list)
    kept: int = 0


class _Target:
    """expat's callbacks, kept to what the report needs (``xml.etree``'s parser target
    protocol): no tree is built, so the file's size costs no memory beyond a failure's
    bounded text, and a DTD is refused by expat itself the moment it meets one (``doctype``,
    before any declaration in it is read): looking for one in the file's first 4 KiB missed
    it behind a longer comment, and expat expanded its entities in this process."""

    def __init__(self, on_case: Callable[[_Case], None]) -> None:
        self.on_case = on_case
        self.stack: list[str] = []
        self.suites: list[list[Any]] = []  # per open <testsuite>: [attrib, has a child suite]
        self.declared = [0, 0, 0, 0]
        self.case: _Case | None = None

    def doctype(self, *_args: object) -> None:
        raise _Refused("DTDs and entities are refused")

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        parent = self.stack[-1] if self.stack else ""
        self.stack.append(tag)
        if tag == "testsuite":
            if self.suites and parent == "testsuite":
                self.suites[-1][1] = True
            self.suites.append([attrib, False])
        elif tag == "testcase":
            if self.case is not None:
                raise _Refused("a <testcase> inside a <testcase> is refused")
            self.case = _Case(dict(attrib))
        elif self.case is not None and parent == "testcase":
            self.case.counts[tag] = self.case.counts.get(tag, 0) + 1
            if tag in _PROBLEMS and not self.case.problem:
                self.case.problem, self.case.problem_attrib = tag, dict(attrib)

    def data(self, text: str) -> None:
        case = self.case
        if case is not None and len(self.stack) > 1 and self.stack[-1] == case.problem \
                and self.stack[-2] == "testcase" and case.kept < _TEXT_MAX \
                and sum(case.counts.get(p, 0) for p in _PROBLEMS) == 1:
            piece = text[:_TEXT_MAX - case.kept]
            case.text.append(piece)
            case.kept += len(piece)

    def end(self, tag: str) -> None:
        self.stack.pop()
        if tag == "testsuite" and self.suites:
            attrib, nested = self.suites.pop()
            if not nested:  # leaves only
                for i, key in enumerate(("tests", "failures", "errors", "skipped")):
                    self.declared[i] += _int(attrib.get(key))
        elif tag == "testcase" and self.case is not None:
            case, self.case = self.case, None
            self.on_case(case)

    def close(self) -> None:
        return None
# pytest's crash line at the end of a failure's text: ``tests/test_m.py:3: AssertionError``
_CRASH = re.compile(r"^([\w./-]+\.py):(\d+): ", re.MULTILINE)
_HEADER = re.compile(r"^_{3,} (.*) _{3,}\s*$")


def node_id(classname: str, name: str, file: str | None, text: str) -> tuple[str, str]:
    """The pytest node id a person or an agent can paste (``tests/test_m.py::TestA::test_x``)
    and ``file:line`` of the failing line, from one ``<testcase>``.

    JUnit names a test ``tests.test_m.TestA`` and ``test_x``; pasted after ``pytest`` that
    finds nothing. With ``file`` (pytest's ``junit_family=xunit1``, which the pytest preset
    asks for) the module is exact; without it, the module is the dotted prefix before the
    first capitalised part (pytest collects classes named ``Test*``). The line is pytest's
    own crash line (``path.py:N: AssertionError``), not the test's ``def``.
    """
    parts = [p for p in classname.split(".") if p]
    if file and file.endswith(".py"):
        module = file[:-3].replace("/", ".")
        rest = classname[len(module) + 1:] if classname.startswith(module + ".") else ""
        path, classes = file, [c for c in rest.split(".") if c]
    else:
        cut = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))
        path = "/".join(parts[:cut]) + ".py" if parts[:cut] else ""
        classes = parts[cut:]
    test_id = "::".join([path, *classes, name]) if path else name
    crashes = [m for m in _CRASH.finditer(text) if m.group(1) == path] or list(
        _CRASH.finditer(text))
    location = f"{crashes[-1].group(1)}:{crashes[-1].group(2)}" if crashes else path
    return test_id, location


_TITLE_MAX = 1024  # a section title indexed at most this long
_KEYS_MAX = 20_000  # and at most this many keys (about 20 MB at the longest)


class _Sections:
    """Where each test's section of the combined log starts, and its first ``E`` line (the
    assertion and its values), read in one pass when the first failing case asks.

    A scan per failing case made a report quadratic in the failures (2,000 failing cases:
    23 s, the event loop blocked, no deadline) and let a log of short lines stall every
    verifier of a round for hours (review 17f)."""

    def __init__(self, inp: ParseInput) -> None:
        self.inp = inp
        self.found: dict[str, tuple[int, int | None]] | None = None

    def _read(self) -> dict[str, tuple[int, int | None]]:
        found: dict[str, tuple[int, int | None]] = {}
        open_: list[str] = []  # the keys of the section being read, still without an E line
        for number, line, _ in _lines(self.inp, COMBINED) or ():
            header = _HEADER.match(line)
            if header:
                title = header.group(1).strip()
                if len(title) > _TITLE_MAX or len(found) >= _KEYS_MAX:
                    open_ = []  # bounded: a name not indexed is looked for when listed
                    continue
                # a test's name is its title or the title's end after one of its last dots
                # before its parameters (Class.test[1.5]); every dot of a hostile title
                # made a key each: a log of 1.6 MB took 1.6 GiB (review 17g)
                dots = [k for k, c in enumerate(title.partition("[")[0]) if c == "."][-4:]
                keys = [title, *(title[k + 1:] for k in dots)]
                open_ = [key for key in keys if key not in found]
                for key in open_:
                    found[key] = (int(number), None)
            elif open_ and line.startswith("E "):
                for key in open_:
                    found[key] = (found[key][0], int(number))
                open_ = []
        return found

    def line(self, name: str) -> int | None:
        """The line to cite for test ``name``: the first ``E`` line of its section, else its
        header, else any mention of the name."""
        if self.found is None:
            self.found = self._read()
        at = self.found.get(name)
        if at is not None:
            return at[1] if at[1] is not None else at[0]
        return _find_line(self.inp, name)


def parse_junit_files(inp: ParseInput, *, result: ParseResult,
                      add_text: Callable[[ParseInput], ParseResult]) -> ParseResult:

    files = sorted(rel for rel in inp.artifacts if rel.startswith("out/") and rel.endswith(".xml"))
    if not files:
        fallback = add_text(inp)
        fallback.error = "no JUnit XML in $CHOIR_OUT"
        return fallback
    declared = [0, 0, 0, 0]  # the producer's own totals (<testsuite tests= failures= ...>)
    tally = [0, 0, 0, 0]  # run, failed, errors, skipped: counted from <testcase> elements
    sections = _Sections(inp)
    firsts: dict[str, Citation | None] = {}

    def on_case(case: _Case) -> None:
        tally[0] += 1
        tally[3] += case.counts.get("skipped", 0) > 0
        # pytest writes one <failure> per failed subtest into its test's element
        tally[1] += case.counts.get("failure", 0)
        tally[2] += case.counts.get("error", 0)
        if not case.problem:
            return
        classname, name = case.attrib.get("classname", ""), case.attrib.get("name", "?")
        text = "".join(case.text)
        test_id, location = node_id(classname, name, case.attrib.get("file"), text)
        message = case.problem_attrib.get("message") or text or case.problem
        sig_id = signature_id("junit", test_id, location, message[:2000])
        if not result.keeps(sig_id):
            # a citation costs a hash of its lines (all of a one-line file): spent on the
            # listed signatures alone, or 16,000 cases on one line took 91 s (review 20)
            result.passed_over(sig_id)
            return
        line = sections.line(name) if name != "?" else None
        result.add(FailureSignature(
            id=sig_id,
            kind=f"test_{case.problem}", test_id=test_id[:256],
            location=location[:256] or None, excerpt=_excerpt(message),
            citation=_cite(inp, COMBINED, line, line) if line else first_line(rel)))

    def first_line(rel: str) -> Citation | None:
        """Line 1 of ``rel``, the citation of a case the log does not name: hashed once."""
        if rel not in firsts:
            firsts[rel] = _cite(inp, rel, 1, 1)
        return firsts[rel]

    for rel in files:
        target = _Target(on_case)
        parser = ET.XMLParser(target=target)
        try:
            with inp.store.open(inp.artifacts[rel]) as fh:
                while chunk := fh.read(_CHUNK):
                    parser.feed(chunk)
                parser.close()
        except _Refused as exc:
            result.error = f"{rel}: {exc}"
        except ET.ParseError as exc:
            result.error = f"{rel}: malformed XML ({exc})"
        declared = [a + b for a, b in zip(declared, target.declared, strict=True)]
    run, failed, errors, skipped = tally
    # The producer's totals are how pytest counts (every subtest is a test, an xfail is a
    # skip); what the elements show can only raise them, so a summary cannot hide a failure.
    run, failed, errors, skipped = (max(a, b) for a, b in
                                    zip((run, failed, errors, skipped), declared, strict=True))
    result.counts = Counts(run=run, failed=failed, errors=errors, skipped=skipped)
    result.ran = run - skipped  # JUnit's tests count the skipped ones (an xfail is a skip)
    return result


def _int(text: str | None) -> int:
    """A count attribute, or 0 when absent or not a small non-negative integer."""
    return int(text) if text is not None and text.isdigit() and len(text) < 10 else 0


def parse_junit(inp: ParseInput) -> ParseResult:
    """The ``junit`` parser: JUnit XML files under ``out/``, else the log as generic text."""
    return parse_junit_files(inp, result=ParseResult(), add_text=parse_generic)
