"""JUnit XML (pytest ``--junitxml`` and any JUnit producer), read streaming and defensively."""

from __future__ import annotations

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
    parse_generic,
)
from choir.report.signatures import signature_id

_FORBIDDEN = (b"<!DOCTYPE", b"<!ENTITY")


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
                        test_id = f"{classname}::{name}" if classname else name
                        message = (problem.get("message") or problem.text or problem.tag)
                        location = elem.get("file") or classname.replace(".", "/")
                        line = _find_line(inp, name) if name != "?" else None
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
