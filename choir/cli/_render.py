"""Human-facing rendering with rich (imported only when a command renders).

Everything shown comes through ``choir._core.terminal``: logs, summaries and file names are
written by the code under verification and must not drive the terminal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_whole(path: Path, text: str) -> None:
    """``text`` written to ``path`` whole (``choir._core.fsopen.write_whole``)."""
    from choir._core import fsopen

    fsopen.write_whole(path, text.encode("utf-8"))


def render_verify(contract: dict[str, Any]) -> None:
    import shlex

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from choir._core.terminal import safe_markup, shorten, strip_controls

    console = Console(stderr=False, highlight=False)
    tail = contract.get("tail_log") or ""
    if tail and contract["status"] != "PASS":
        console.rule("tail of the logs (for you only; never shown to an agent)")
        console.out(strip_controls(tail), highlight=False)
    platform = contract.get("manifest", {}).get("platform", {})
    isolation = f"sandbox {platform.get('sandbox', '?')} (isolation: {platform.get('isolation')})"
    table = Table(title=safe_markup(f"choir verify  {contract['run_id']}  mood {contract['mood']}  "
                                    f"{isolation}"))
    for column in ("verifier", "result", "confidence", "summary"):
        table.add_column(column)
    threads = contract.get("threads") or [{} for _ in contract["reports"]]
    for report, thread in zip(contract["reports"], threads, strict=True):
        style = {"PASS": "green", "INCONCLUSIVE": "yellow"}.get(report["result"], "red")
        label = f"{report['verifier']}#{thread.get('replica', 0)}" + (
            f" ({thread['lens']})" if thread.get("lens", "default") != "default" else "")
        table.add_row(Text(label), Text(report["result"], style=style),
                      f"{report['confidence']:.2f}",
                      Text(shorten(strip_controls(report["summary"]), 100)))  # text, never markup
    console.print(table)
    failing: dict[tuple[str, str], list[str]] = {}
    for test in contract.get("failing_tests") or []:
        key = (strip_controls(test["node_id"]), strip_controls(test.get("location") or ""))
        failing.setdefault(key, []).append(f"{test['verifier']}#{test['replica']}")
    if failing:
        console.print("[bold red]failing tests[/] (paste a node id after `python3 -m pytest`):")
        for (node, where), labels in list(failing.items())[:30]:
            # quoted for a shell: a parametrized id holds spaces and brackets (review 17h)
            console.out(f"  {shlex.quote(node)}" + (f"  ({where})" if where else "")
                        + f"   [{', '.join(labels)}]", highlight=False)
        if len(failing) > 30:
            console.print(f"  ... and {len(failing) - 30} more (--json lists them all)")
    from choir.app.base_lines import base_lines

    for line in base_lines(contract):
        console.out(line, highlight=False)
    verdict = contract.get("verdict") or contract["status"]
    colour = {"PASS": "green", "INCONCLUSIVE": "yellow"}.get(verdict, "red")
    console.print(f"[bold {colour}]{safe_markup(verdict)}[/]  "
                  f"{safe_markup(isolation)}  attestations: "
                  + safe_markup(", ".join(a[:16] for a in contract["attestations"])))
    console.print("artifacts: " + safe_markup(", ".join(contract["artifact_paths"])))
