"""``choir verify``: thin wrapper over ``choir.app.verify.verify_tree``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from choir._core.terminal import one_line
from choir.cli._errors import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK, OTEL_HELP

_MOODS = ["CALM", "SKEPTICAL", "PARANOID", "BOLD", "CURIOUS"]


@click.command()
@click.option("--repo", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="The repo to verify (holds choir.yaml).")
@click.option("--mood", type=click.Choice(_MOODS, case_sensitive=False), default=None,
              help="Strictness (default CALM).")
@click.option("--sandbox", "sandbox_name", default=None,
              help="docker | bwrap | local | auto (default: choir.yaml, else auto).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option("--claim", default=None, metavar="NAME",
              help="Record the verdict in the AHDB as claim NAME: `choir gate NAME` then "
                   "answers for this tree.")
@click.option("--base", default=None, metavar="REF",
              help="Verify with the checks of commit REF (a pull request's base): its "
                   "choir.yaml, and its spec files (tests, conftest.py, ...) in place of the "
                   "tree's. A tree that changes or deletes one is held: never PASS.")
@click.option("--approve-spec-change", "approve_spec", is_flag=True,
              help="With --base: a person approved the tree's changes to the base's checks; "
                   "verify with the tree's versions (recorded as approved).")
@click.option("--otel", is_flag=True, help=OTEL_HELP)
@click.option("--pinned-config", "pinned", default=None, hidden=True, metavar="BLAKE3",
              help="Refuse a choir.yaml whose bytes do not hash to this (`choir mcp`'s pin, "
                   "passed to a `choir serve` worker).")
def verify(repo: Path, mood: str | None, sandbox_name: str | None, as_json: bool,
           claim: str | None, base: str | None, approve_spec: bool, otel: bool,
           pinned: str | None) -> int:
    """Verify the working tree now: exit 0 PASS, 1 FAIL, 2 configuration error,
    4 INCONCLUSIVE (nothing failed, but some verifier could not decide)."""
    from choir.telemetry import session

    if approve_spec and base is None:
        raise click.UsageError("--approve-spec-change approves a change to --base's checks; "
                               "pass --base REF too")
    with session(otel):
        return run_verify(repo, mood=mood, sandbox_name=sandbox_name, as_json=as_json,
                          claim=claim, pinned=pinned, base=base, approve_spec=approve_spec)


def run_verify(repo: Path, *, mood: str | None, sandbox_name: str | None, as_json: bool,
               claim: str | None = None, pinned: str | None = None, base: str | None = None,
               approve_spec: bool = False) -> int:
    """The one path ``choir verify`` and ``choir init`` take: verify, render, exit code."""
    from choir.app.verify import verify_tree
    from choir.models import Mood

    progress = _progress(as_json)
    try:
        outcome = verify_tree(repo, mood=Mood(mood.upper()) if mood else None,
                              sandbox_name=sandbox_name, on_event=progress, claim=claim,
                              pinned=pinned, base=base, approve_spec=approve_spec)
    finally:
        progress.close()
    if as_json:
        click.echo(json.dumps(outcome.contract, indent=2, sort_keys=True))
    else:
        from choir.cli._render import render_verify

        render_verify(outcome.contract)
        if claim is not None:
            found = outcome.contract["claim"]
            asserted = found["asserted"]
            click.echo(f"claim {claim}: " + (f"ASSERTed ({asserted[:12]}); `choir gate {claim}` "
                                             "answers for this tree" if asserted else
                                             f"not ASSERTed: {one_line(found['reason'], 600)}"))
    if outcome.passed:
        return EXIT_OK
    return EXIT_INCONCLUSIVE if outcome.verdict == "INCONCLUSIVE" else EXIT_FAIL


def _progress(as_json: bool) -> Any:
    """``choir run``'s live view on a terminal (plain lines on stderr otherwise), plus a
    warning on stderr when the sandbox isolates nothing."""
    from choir._core.terminal import safe_markup, strip_controls
    from choir.cli._progress import PlainConsole, Progress, stderr_console

    console = stderr_console()
    view = Progress(console=console, live=console.is_terminal and not as_json)
    plain = isinstance(console, PlainConsole)

    class _Verify:
        def __call__(self, kind: str, data: dict[str, Any]) -> None:
            if data.get("kind") == "sandbox":
                name, why = str(data["name"]), str(data.get("why", ""))
                warning = (f"sandbox '{strip_controls(name)}' isolates nothing: verifier "
                           "commands run as you, with your files, keys and network. Use "
                           "--sandbox bwrap or docker.")
                if plain:
                    console.print(f"sandbox {strip_controls(name)}: {strip_controls(why)}")
                    if data.get("isolation") == "none":
                        console.print(f"warning: {warning}")
                    return
                console.print(f"[dim]sandbox {safe_markup(name)}: {safe_markup(why)}[/]",
                              soft_wrap=True)
                if data.get("isolation") == "none":
                    console.print(f"[bold yellow]warning:[/] {safe_markup(warning)}")
                return
            view(kind, data)

        def close(self) -> None:
            view.close()

    return _Verify()
