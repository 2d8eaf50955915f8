"""JUnit XML (pytest ``--junitxml`` and any JUnit producer), read streaming and defensively."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable

from choir.models import Counts, FailureSignature
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

_FORBIDDEN = (b"<!DOCTYPE", b"<!ENTITY")
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


def _failure_line(inp: ParseInput, name: str) -> int | None:
    """The line of the combined log to cite for test ``name``: the first ``E`` line of its
    section (the assertion and its values), else the section's header, else any mention."""
    header: int | None = None
    for number, line, _ in _lines(inp, COMBINED) or ():
        found = _HEADER.match(line)
        if found:
            if header is not None:
                break  # the next test's section: this one had no E line
            title = found.group(1).strip()
            if title == name or title.endswith("." + name):
                header = int(number)
            continue
        if header is not None and line.startswith("E "):
            return int(number)
    return header if header is not None else _find_line(inp, name)


def parse_junit_files(inp: ParseInput, *, result: ParseResult,
                      add_text: Callable[[ParseInput], ParseResult]) -> ParseResult:

    files = sorted(rel for rel in inp.artifacts if rel.startswith("out/") and rel.endswith(".xml"))
    if not files:
        fallback = add_text(inp)
        fallback.error = "no JUnit XML in $CHOIR_OUT"
        return fallback
    run = failed = errors = skipped = 0  # counted from <testcase> elements
    declared = [0, 0, 0, 0]  # the producer's own totals (<testsuite tests= failures= ...>)
    for rel in files:
        digest = inp.artifacts[rel]
        head = inp.store.read_bytes(digest, limit=4096)
        if any(marker in head for marker in _FORBIDDEN):
            result.error = f"{rel}: DTDs and entities are refused"
            continue
        try:
            with inp.store.open(digest) as fh:
                for _, elem in ET.iterparse(fh, events=("end",)):
                    if elem.tag == "testsuite":
                        if not any(child.tag == "testsuite" for child in elem):  # leaves only
                            for i, key in enumerate(("tests", "failures", "errors", "skipped")):
                                declared[i] += _int(elem.get(key))
                        elem.clear()
                        continue
                    if elem.tag != "testcase":
                        continue
                    run += 1
                    problems = [c for c in elem if c.tag in ("failure", "error")]
                    if any(c.tag == "skipped" for c in elem):
                        skipped += 1
                    # pytest writes one <failure> per failed subtest into its test's element
                    failed += sum(c.tag == "failure" for c in problems)
                    errors += sum(c.tag == "error" for c in problems)
                    problem = problems[0] if problems else None
                    if problem is not None:
                        classname = elem.get("classname", "")
                        name = elem.get("name", "?")
                        test_id, location = node_id(classname, name, elem.get("file"),
                                                    problem.text or "")
                        message = (problem.get("message") or problem.text or problem.tag)
                        line = _failure_line(inp, name) if name != "?" else None
                        result.add(FailureSignature(
                            id=signature_id("junit", test_id, location, message[:2000]),
                            kind=f"test_{problem.tag}", test_id=test_id[:256],
                            location=location[:256] or None, excerpt=_excerpt(message),
                            citation=(_cite(inp, COMBINED, line, line) if line
                                      else _cite(inp, rel, 1, 1))))
                    elem.clear()
        except ET.ParseError as exc:
            result.error = f"{rel}: malformed XML ({exc})"
    # The producer's totals are how pytest counts (every subtest is a test, an xfail is a
    # skip); what the elements show can only raise them, so a summary cannot hide a failure.
    run, failed, errors, skipped = (max(a, b) for a, b in
                                    zip((run, failed, errors, skipped), declared, strict=True))
    result.counts = Counts(run=run, failed=failed, errors=errors, skipped=skipped)
    return result


def _int(text: str | None) -> int:
    """A count attribute, or 0 when absent or not a small non-negative integer."""
    return int(text) if text is not None and text.isdigit() and len(text) < 10 else 0


def parse_junit(inp: ParseInput) -> ParseResult:
    """The ``junit`` parser: JUnit XML files under ``out/``, else the log as generic text."""
    return parse_junit_files(inp, result=ParseResult(), add_text=parse_generic)
