"""JUnit XML (pytest ``--junitxml`` and any JUnit producer), read streaming and defensively."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import TYPE_CHECKING

from choir.models import Counts, FailureSignature
from choir.report.signatures import signature_id

if TYPE_CHECKING:
    from choir.report.parsers import ParseInput, ParseResult

_FORBIDDEN = (b"<!DOCTYPE", b"<!ENTITY")


def parse_junit_files(inp: ParseInput, *, result: ParseResult,
                      add_text: Callable[[ParseInput], ParseResult]) -> ParseResult:
    from choir.report.parsers import COMBINED, _cite, _excerpt, _find_line

    files = sorted(rel for rel in inp.artifacts if rel.startswith("out/") and rel.endswith(".xml"))
    if not files:
        fallback = add_text(inp)
        fallback.error = "no JUnit XML in $CHOIR_OUT"
        return fallback
    run = failed = errors = skipped = 0
    for rel in files:
        digest = inp.artifacts[rel]
        head = inp.store.read_bytes(digest, limit=4096)
        if any(marker in head for marker in _FORBIDDEN):
            result.error = f"{rel}: DTDs and entities are refused"
            continue
        try:
            with inp.store.open(digest) as fh:
                for _, elem in ET.iterparse(fh, events=("end",)):
                    if elem.tag != "testcase":
                        continue
                    run += 1
                    problem = next((c for c in elem if c.tag in ("failure", "error")), None)
                    if any(c.tag == "skipped" for c in elem):
                        skipped += 1
                    if problem is not None:
                        if problem.tag == "failure":
                            failed += 1
                        else:
                            errors += 1
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
    result.counts = Counts(run=run, failed=failed, errors=errors, skipped=skipped)
    return result
