"""The report's summary for a person: as GitHub step-summary markdown, and as plain text.

Everything in a verify contract beyond Choir's own words is hostile: a verifier's name (a
pull request can edit ``choir.yaml``), its report summary, test names, locations, excerpts.
In the step summary such text must not become markdown or HTML (a heading saying PASS, a
link, an image that calls out, a table row that was never there), so it is written only
inside HTML blocks (``<table>``, ``<p>``), HTML-escaped, each value on one line: an HTML
block runs to the next blank line and its content is not read as markdown, and an escaped
value holds no tag, entity or line break to end it. The headings are Choir's fixed words.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from choir._core.terminal import one_line
from choir.app.base_lines import base_lines

ROWS_MAX = 50
TEXT_MAX = 300


@dataclass
class Outcome:
    """What the CI run found: the verify contract, the gate's answer, and the evidence."""

    verify_code: int
    contract: dict[str, Any] | None
    error: str = ""
    """Why ``choir verify`` gave no contract (its message; a configuration error)."""
    gate_code: int | None = None
    gate_lines: list[str] = field(default_factory=list)
    bundle: str | None = None
    envelopes: int = 0
    key_id: str | None = None
    unisolated: bool = False
    """The verifiers ran with no isolation though the workflow did not ask for ``local``."""

    @property
    def gate_open(self) -> bool:
        """The gate opened, for a run isolated unless the workflow asked otherwise."""
        return self.gate_code == 0 and not self.unisolated

    @property
    def status(self) -> str:
        """PASS only when verify passed and the gate opened; ERROR when nothing was
        verified."""
        if self.contract is None:
            return "ERROR"
        return "PASS" if self.verify_code == 0 and self.gate_open else "FAIL"

    @property
    def exit_code(self) -> int:
        return {"PASS": 0, "FAIL": 1}.get(self.status, 2)


def _cell(value: object, limit: int = TEXT_MAX) -> str:
    return html.escape(one_line(value, limit), quote=True)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>"
                   for row in rows[:ROWS_MAX])
    more = f"<p>and {len(rows) - ROWS_MAX} more</p>" if len(rows) > ROWS_MAX else ""
    return f"<table><tr>{head}</tr>{body}</table>{more}\n\n"


def report_rows(contract: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(verifier#replica, result, summary) per report."""
    threads = contract.get("threads") or [{} for _ in contract.get("reports", [])]
    return [(f"{report.get('verifier')}#{thread.get('replica', 0)}", str(report.get("result")),
             str(report.get("summary", "")))
            for report, thread in zip(contract.get("reports", []), threads, strict=False)]


def markdown(outcome: Outcome, *, claim: str) -> str:
    """The step summary: the verdict, the reports, the failing tests, the gate, the evidence."""
    parts = [f"## Choir: {outcome.status}\n\n"]
    contract = outcome.contract
    if contract is None:
        parts.append("`choir verify` did not run the verifiers (exit "
                     f"{int(outcome.verify_code)}):\n\n")
        parts.append(f"<pre>{_cell(outcome.error, 2000)}</pre>\n\n")
        return "".join(parts)
    parts.append(f"<p>verify: {_cell(contract.get('verdict') or contract.get('status'))}, "
                 f"mood {_cell(contract.get('mood'))}, run {_cell(contract.get('run_id'))}</p>"
                 "\n\n")
    parts.append(_table(("verifier", "result", "summary"), report_rows(contract)))
    if checks := base_lines(contract):
        parts.append("### Checks\n\n")
        parts.append(f"<pre>{html.escape(chr(10).join(checks))}</pre>\n\n")
    failing = [(t.get("node_id"), t.get("location") or "", t.get("excerpt") or "")
               for t in contract.get("failing_tests") or []]
    if failing:
        parts.append("### Failing tests\n\n")
        parts.append(_table(("test", "where", "excerpt"), failing))
    parts.append(f"### Gate: {'open' if outcome.gate_open else 'refused'}\n\n")
    parts.append(f"<pre>{html.escape(chr(10).join(one_line(x) for x in outcome.gate_lines))}"
                 "</pre>\n\n")
    evidence = [f"claim {claim}", f"{len(contract.get('attestations') or [])} attestation(s)"]
    if outcome.bundle:
        evidence.append(f"in-toto bundle {outcome.bundle} ({outcome.envelopes} envelopes)")
    if outcome.key_id:
        evidence.append(f"signed by key {outcome.key_id}")
    parts.append(f"<p>{_cell(' · '.join(evidence), 1000)}</p>\n")
    return "".join(parts)


def plain(outcome: Outcome, *, claim: str) -> str:
    """The same for a terminal (the pre-commit hook): plain lines, controls stripped."""
    lines = [f"choir: {outcome.status}"]
    contract = outcome.contract
    if contract is None:
        return "\n".join([*lines, one_line(outcome.error, 2000)]) + "\n"
    lines[0] += (f"  (verify {one_line(contract.get('verdict') or contract.get('status'))}, "
                 f"run {one_line(contract.get('run_id'))})")
    for name, result, summary in report_rows(contract):
        lines.append(f"  {one_line(name, 60):<24} {one_line(result, 16):<12} "
                     f"{one_line(summary, 120)}")
    lines += [f"  {line}" for line in base_lines(contract)]
    for test in (contract.get("failing_tests") or [])[:ROWS_MAX]:
        where = f"  ({one_line(test['location'], 120)})" if test.get("location") else ""
        lines.append(f"  failing: {one_line(test.get('node_id'))}{where}")
    lines.append(f"gate {claim}: {'open' if outcome.gate_open else 'refused'}")
    lines += [f"  {one_line(x)}" for x in outcome.gate_lines]
    if outcome.bundle:
        lines.append(f"in-toto bundle: {outcome.bundle} ({outcome.envelopes} envelopes)")
    return "\n".join(lines) + "\n"
