"""``choir plan run PLAN.yaml`` and ``choir promote PLAN_ID --to BRANCH``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from choir.cli._errors import EXIT_FAIL, EXIT_OK


@click.group("plan")
def plan() -> None:
    """Plans: many work items, many members, one verified integration."""


def _shown(value: Any, limit: int) -> str:
    """A row's field as one plain line: a member chooses what its item's ``last`` says (the
    paths of its worktree are quoted there): escape sequences set a review's terminal title,
    a line break would start a row of its own."""
    from choir._core.terminal import one_line

    return one_line(value, limit)


def _line(event: dict[str, Any]) -> None:
    click.echo(f"  {_shown(event['item'], 60):<20} {_shown(event.get('member') or '-', 40):<10} "
               f"{_shown(event['state'], 20):<8} attempt {event.get('attempt', 0)}  "
               f"{_shown(event.get('last', ''), 70)}", err=True)


def _with_table(loaded: Any, drive: Any) -> dict[str, Any]:
    """Drive the plan under a live table on the terminal: one row per item (member, state,
    attempt, last verdict), redrawn on every transition."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    rows: dict[str, dict[str, Any]] = {
        i.id: {"member": i.member or "-", "state": "pending", "attempt": 0, "last": ""}
        for i in loaded.items}

    def table() -> Table:
        out = Table(title=f"plan {loaded.id}")
        for name in ("item", "member", "state", "attempt", "last verdict"):
            out.add_column(name)
        for item_id, row in rows.items():  # text, never markup: `[/x]` in a path a
            # member chose was a rich tag that ended the plan (and every resume) on a terminal
            out.add_row(*(Text(_shown(v, n)) for v, n in (
                (item_id, 60), (row["member"] or "-", 40), (row["state"], 20),
                (row["attempt"], 10), (row["last"], 80))))
        return out

    with Live(table(), console=Console(), auto_refresh=False) as live:
        def update(event: dict[str, Any]) -> None:  # a part split from an item: a new row
            row = rows.setdefault(event["item"], {"member": "-", "state": "pending",
                                                  "attempt": 0, "last": ""})
            row.update({k: event.get(k, row[k]) for k in ("member", "state", "attempt",
                                                          "last")})
            live.update(table(), refresh=True)

        return dict(drive(update))


@plan.command("run")
@click.argument("plan_file", type=click.Path(path_type=Path), required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the plan's record as JSON.")
@click.option("--resume", "resume_id", default=None, help="Finish plan ID after a crash.")
def run(plan_file: Path | None, as_json: bool, resume_id: str | None) -> int:
    """Run PLAN_FILE's items side by side; merge what is ASSERTed; verify the integration."""
    import asyncio

    from choir._core import warm
    from choir.exceptions import UserError
    from choir.team.driver import run_plan
    from choir.team.plan import load_plan
    from choir.team.state import load_state

    if resume_id is not None:
        old = load_state(resume_id)
        if old is None or "plan_file" not in old:
            raise UserError(f"no plan {resume_id} to resume")
        if not old["plan_file"]:
            raise UserError(f"plan {resume_id} was run from Python without a plan file on "
                            "record\n  fix: resume it from Python: run_plan(plan, "
                            "resume=True)")
        plan_file = Path(old["plan_file"])
    if plan_file is None:
        raise UserError("give PLAN_FILE, or --resume ID")
    loaded = load_plan(plan_file)
    live = not as_json and sys.stdout.isatty()
    # one process runs every item's rounds: the packaged policy and presets are parsed, and
    # the installed plugins scanned, once for the plan (12-45 ms each, several times a round)
    warm.enable()

    def drive(on_event: Any) -> dict[str, Any]:
        return asyncio.run(run_plan(loaded, resume=resume_id is not None,
                                    plan_file=plan_file.resolve(), on_event=on_event))

    state = _with_table(loaded, drive) if live else drive(None if as_json else _line)
    if as_json:
        click.echo(json.dumps(state, indent=1, sort_keys=True))
    else:
        click.echo(f"plan {loaded.id}: {state['status']}; integration "
                   f"{state['integration'][:12]} on choir/plan/{loaded.id}/integration")
    return EXIT_OK if state["status"] == "asserted" else EXIT_FAIL


@click.command("promote")
@click.argument("plan_id")
@click.option("--to", "to", required=True, help="The branch to fast-forward.")
@click.option("--repo", type=click.Path(path_type=Path), default=None,
              help="The repo (default: the plan's).")
@click.option("--expect-head", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A signed head the AHDB's log must still contain (`choir ahdb head`): a "
              "log rolled back behind it moves nothing.")
def promote(plan_id: str, to: str, repo: Path | None, expect_head: Path | None) -> int:
    """Fast-forward BRANCH to PLAN_ID's integration commit, only when its gate holds."""
    from choir.ahdb.anchor import load_pin
    from choir.exceptions import PromotionError, UserError
    from choir.team.promote import promote as do_promote

    pin = load_pin(expect_head) if expect_head else None
    try:
        head = do_promote(plan_id, to, repo, pin=pin,
                          pin_source=f"the pinned head {expect_head}")
    except (UserError, PromotionError) as err:
        if isinstance(err, UserError) and not str(err).startswith("promote: refused"):
            raise  # no such plan or repository: a usage error (exit 2, on stderr)
        click.echo(str(err))  # refused, with the reason: exit 1
        return EXIT_FAIL
    click.echo(f"promote: {to} -> {head[:12]} (plan {plan_id} ASSERTed for exactly this tree)")
    return EXIT_OK
