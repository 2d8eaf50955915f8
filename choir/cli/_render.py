"""Human-facing rendering with rich (imported only when a command renders)."""

from __future__ import annotations

from typing import Any


def render_verify(contract: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False, highlight=False)
    tail = contract.get("tail_log") or ""
    if tail and contract["status"] != "PASS":
        console.rule("tail of the logs (for you only; never shown to an agent)")
        console.out(tail, highlight=False)
    table = Table(title=f"choir verify  {contract['run_id']}  mood {contract['mood']}")
    for column in ("verifier", "result", "confidence", "summary"):
        table.add_column(column)
    for report in contract["reports"]:
        style = "green" if report["result"] == "PASS" else "red"
        table.add_row(report["verifier"], f"[{style}]{report['result']}[/{style}]",
                      f"{report['confidence']:.2f}", report["summary"][:100])
    console.print(table)
    colour = "green" if contract["status"] == "PASS" else "red"
    console.print(f"[bold {colour}]{contract['status']}[/]  attestations: "
                  + ", ".join(a[:16] for a in contract["attestations"]))
    console.print(f"artifacts: {', '.join(contract['artifact_paths'])}")
