"""Linters and static analysis: ruff JSON, mypy text, SARIF 2.1.0 (bandit, semgrep, CodeQL)."""

from __future__ import annotations

import json
import re
from typing import Any

from choir.models import Counts, FailureSignature
from choir.report.parsers import (
    COMBINED,
    JSON_MAX,
    ParseInput,
    ParseResult,
    _cite,
    _excerpt,
    _lines,
    json_objects,
)
from choir.report.signatures import signature_id


def _step_json(inp: ParseInput) -> list[Any]:
    found = [obj for _, obj in json_objects(inp, ".json")]
    for rel, digest in sorted(inp.artifacts.items()):
        if rel.startswith("logs/step-"):
            raw = inp.store.read_bytes(digest, limit=JSON_MAX)
            start = raw.find(b"[")
            try:
                found.append(json.loads(raw[start:])) if start >= 0 else None
            except ValueError:
                continue
    return found


def parse_ruff_json(inp: ParseInput, result: ParseResult) -> ParseResult:
    diagnostics = [d for doc in _step_json(inp) if isinstance(doc, list) for d in doc
                   if isinstance(d, dict) and "code" in d]
    for d in diagnostics:
        location = f"{d.get('filename', '?')}:{(d.get('location') or {}).get('row', '?')}"
        rule = str(d.get("code") or "syntax")
        message = str(d.get("message", ""))
        result.add(FailureSignature(id=signature_id("lint", rule, location, message),
                                    kind="lint", test_id=rule[:256], location=location[-256:],
                                    excerpt=_excerpt(f"{rule} {message}")))
    result.counts = Counts(run=None, failed=len(diagnostics))
    if not diagnostics and inp.exit_codes and inp.exit_codes[-1] != 0:
        result.error = "ruff failed but printed no JSON diagnostics"
    return result


_MYPY = re.compile(
    r"^(?P<file>[^:\s]+):(?P<line>\d+)(?::\d+)?: error: (?P<msg>.*?)(?:  \[(?P<code>[\w-]+)\])?$"
)
# Errors about a whole file or folder, with no line: mypy stops at them before it checks
# anything (exit 2). A module found twice, a package no import can name: the tree's fault,
# whoever planted it, so a failure to fix. Not counted, they let an empty module of the same
# name turn a type error into "mypy could not run", INCONCLUSIVE (review 23b). A file that
# cannot be read is the command's fault (a path not there): that mypy did not run.
_MYPY_FILE = re.compile(r"^(?P<file>[^:\s]+\.pyi?): error: (?!Cannot read file)"
                        r"(?P<msg>.*?)(?:  \[(?P<code>[\w-]+)\])?$")
_MYPY_PACKAGE = re.compile(
    r"^(?P<file>.+?) (?P<msg>contains __init__\.pyi? but is not a valid Python package name)$")


def parse_mypy_text(inp: ParseInput, result: ParseResult) -> ParseResult:
    errors = 0
    for number, line, _ in _lines(inp, COMBINED) or ():
        match = _MYPY.match(line) or _MYPY_FILE.match(line) or _MYPY_PACKAGE.match(line)
        if not match:
            continue
        errors += 1
        groups = match.groupdict()
        code = groups.get("code") or "error"
        location = match.group("file") + (f":{groups['line']}" if groups.get("line") else "")
        result.add(FailureSignature(
            id=signature_id("typecheck", code, match.group("file"), match.group("msg")),
            kind="typecheck", test_id=code[:256], location=location[-256:],
            excerpt=_excerpt(match.group("msg")), citation=_cite(inp, COMBINED, number, number)))
    result.counts = Counts(failed=errors)
    return result


def parse_sarif_files(inp: ParseInput, result: ParseResult) -> ParseResult:
    findings = 0
    unread: list[str] = []
    docs = json_objects(inp, ".sarif", unread=unread) + \
        json_objects(inp, ".sarif.json", unread=unread)
    if unread:  # its findings unread: the files that were read cannot decide alone
        result.error = "SARIF not read: " + "; ".join(unread)
    elif not docs:
        result.error = "no SARIF file in $CHOIR_OUT"
    for _, doc in docs:
        runs = doc.get("runs", []) if isinstance(doc, dict) else []
        for run in runs if isinstance(runs, list) else []:
            for res in (run.get("results") or []) if isinstance(run, dict) else []:
                if not isinstance(res, dict):
                    continue
                findings += 1
                rule = str(res.get("ruleId", "?"))
                message = str((res.get("message") or {}).get("text", ""))
                loc = ((res.get("locations") or [{}])[0].get("physicalLocation") or {})
                where = f"{(loc.get('artifactLocation') or {}).get('uri', '?')}:" \
                        f"{(loc.get('region') or {}).get('startLine', '?')}"
                result.add(FailureSignature(id=signature_id("sarif", rule, where, message),
                                            kind="static_analysis", test_id=rule[:256],
                                            location=where[-256:], excerpt=_excerpt(message)))
    result.counts = Counts(failed=findings)
    return result


def parse_ruff(inp: ParseInput) -> ParseResult:
    """``ruff check --output-format json`` written to stdout (the step log) or ``out/``."""
    return parse_ruff_json(inp, ParseResult())


def parse_mypy(inp: ParseInput) -> ParseResult:
    return parse_mypy_text(inp, ParseResult())


def parse_sarif(inp: ParseInput) -> ParseResult:
    return parse_sarif_files(inp, ParseResult())
