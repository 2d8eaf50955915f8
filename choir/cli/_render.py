"""Human-facing rendering with rich (imported only when a command renders).

Everything shown comes through ``choir._terminal``: logs, summaries and file names are
written by the code under verification and must not drive the terminal.
"""

from __future__ import annotations

from typing import Any


def render_verify(contract: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from choir._terminal import safe_markup, strip_controls

    console = Console(stderr=False, highlight=False)
    tail = contract.get("tail_log") or ""
    if tail and contract["status"] != "PASS":
        console.rule("tail of the logs (for you only; never shown to an agent)")
        console.out(strip_controls(tail), highlight=False)
    table = Table(title=safe_markup(f"choir verify  {contract['run_id']}  mood {contract['mood']}"))
    for column in ("verifier", "result", "confidence", "summary"):
        table.add_column(column)
    for report in contract["reports"]:
        style = "green" if report["result"] == "PASS" else "red"
        table.add_row(safe_markup(report["verifier"]),
                      f"[{style}]{safe_markup(report['result'])}[/{style}]",
                      f"{report['confidence']:.2f}", safe_markup(report["summary"][:100]))
    console.print(table)
    colour = "green" if contract["status"] == "PASS" else "red"
    console.print(f"[bold {colour}]{safe_markup(contract['status'])}[/]  attestations: "
                  + safe_markup(", ".join(a[:16] for a in contract["attestations"])))
    console.print("artifacts: " + safe_markup(", ".join(contract["artifact_paths"])))
