"""``choir run``, ``choir approve`` and ``choir gate``: thin wrappers over ``choir.graph``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click

from choir.cli._errors import EXIT_FAIL, EXIT_OK, OTEL_HELP

_MOODS = ["CALM", "SKEPTICAL", "PARANOID", "BOLD", "CURIOUS"]


def _progress(as_json: bool) -> Any:
    """Live on a terminal; plain lines on stderr otherwise (and always with --json)."""
    from choir.cli._progress import Progress, stderr_console

    console = stderr_console()
    return Progress(console=console, live=console.is_terminal and not as_json)


def _drive(coro_fn: Any, as_json: bool) -> int:
    progress = _progress(as_json)
    try:
        outcome = asyncio.run(coro_fn(progress))
    finally:
        progress.close()
    return _finish(outcome, as_json)


def _finish(outcome: Any, as_json: bool) -> int:
    from choir.cli._progress import spend_lines

    if as_json:
        from choir.cli.runs import show_run

        stored = show_run(outcome.run_id, with_output=False)  # reports, attestations, verdicts
        click.echo(json.dumps({**stored, **outcome.__dict__}, indent=2, default=str))
    else:
        click.echo(f"{outcome.status.upper()}  run {outcome.run_id}  {outcome.work_item}  "
                   f"attempt {outcome.attempt}  mood {outcome.mood}  {outcome.reason}")
        for line in spend_lines(outcome.usage):
            click.echo(line)
        if outcome.status == "awaiting_approval":
            diff = outcome.question.get("diff")
            if diff:  # a held spec change: the executor's edit of the checks, to judge
                from choir._core.terminal import strip_controls

                click.echo("the spec change to approve (pinned -> executor's):")
                click.echo(strip_controls(str(diff)))
            click.echo(f"waiting for a human: choir approve {outcome.run_id} [--reject]")
    code: int = outcome.exit_code()
    return code


@click.command()
@click.argument("workitem", required=False, type=click.Path(path_type=Path))
@click.option("--mood", type=click.Choice(_MOODS, case_sensitive=False), default=None)
@click.option("--run-id", default=None, help="Name the run (default: generated).")
@click.option("--resume", "resume_id", default=None, help="Continue RUN_ID after a crash.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option("--otel", is_flag=True, help=OTEL_HELP)
def run(workitem: Path | None, mood: str | None, run_id: str | None, resume_id: str | None,
        as_json: bool, otel: bool) -> int:
    """Run the loop until ASSERT, halt or budget end: 0 ASSERTed, 1 halted, 3 awaiting approval."""
    from choir.exceptions import UserError
    from choir.graph import runner
    from choir.models import Mood
    from choir.telemetry import session

    if resume_id:
        with session(otel):
            return _drive(lambda on: runner.resume(resume_id, on_event=on), as_json)
    if workitem is None:
        raise UserError("give a work item file, or --resume RUN_ID")
    chosen, path = Mood(mood.upper()) if mood else None, workitem
    with session(otel):
        return _drive(lambda on: runner.run_work_item(path, mood=chosen, run_id=run_id,
                                                      on_event=on), as_json)


@click.command()
@click.argument("run_id")
@click.option("--reject", is_flag=True, help="Refuse instead of approving.")
@click.option("--otel", is_flag=True, help=OTEL_HELP)
def approve(run_id: str, reject: bool, otel: bool) -> int:
    """Answer a human-approval gate and finish the run."""
    from choir.graph import runner
    from choir.telemetry import session

    with session(otel):
        return _drive(lambda on: runner.approve(run_id, reject=reject, on_event=on), False)


@click.command()
@click.argument("work_item_id")
@click.option("--commit", default=None, help="Only an ASSERT for exactly this commit.")
@click.option("--repo", type=click.Path(path_type=Path), default=None,
              help="The working tree to check (default: the current directory's).")
@click.option("--expect-head", "expect_head", type=click.Path(path_type=Path), default=None,
              metavar="FILE", help="Refuse unless the AHDB log contains this exported head.")
@click.option("--seen-heads", "seen_heads", type=click.Path(path_type=Path), default=None,
              metavar="FILE", help="The high-water marks to check and move up (default: "
              "$CHOIR_SEEN_HEADS, else ~/.config/choir/seen-heads).")
@click.option("--vsa", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Also write the decision, PASSED or FAILED, as a signed SLSA verification "
              "summary (a DSSE envelope on one line: append it to an in-toto bundle).")
@click.option("--resource-uri", "resource_uri", default=None, metavar="URI",
              help="The VSA's resourceUri: what was verified, e.g. git+https://github.com/O/R "
              "(default: choir:claim:WORK_ITEM_ID).")
def gate(work_item_id: str, commit: str | None, repo: Path | None, expect_head: Path | None,
         seen_heads: Path | None, vsa: Path | None, resource_uri: str | None) -> int:
    """Exit 0 only if WORK_ITEM_ID is ASSERTed with valid, trusted attestations for the tree.

    The tree is --repo's, else the current directory's; with --commit, that commit's tree.
    Exit 1 otherwise, 2 when no tree can be determined.
    """
    from choir.ahdb.anchor import SeenHeads, load_pin
    from choir.app.gate import check_gate, gate_target
    from choir.team.promote import check_plan_gate, is_plan

    # a plan's id is the plan's gate whatever tree is asked about: --repo or --commit name
    # the tree it must be (its final integration tree), never a way around the plan's items
    # (review 17h: a failed plan's integration head opened the gate as "a claim")
    plan = is_plan(work_item_id)
    tree, sha = (None, None) if plan and repo is None and commit is None else \
        gate_target(repo, commit)
    pin = load_pin(expect_head) if expect_head else None
    marks = seen_heads or SeenHeads.default_path()
    # a commit read from git is checked by its tree: the bytes, not the label
    anchors: Any = {"pin": pin, "pin_source": f"the pinned head {expect_head}",
                    "seen": SeenHeads(marks) if marks else None}
    if plan and sha and not tree:  # a commit whose tree could not be read here
        from choir.app.gate import GateAnswer

        answer = GateAnswer(False, work_item_id, None, None, problems=[
            f"commit {sha[:12]}'s tree cannot be read here (not a git work tree): pass --repo "
            "DIR, the plan's repo"])
    else:
        answer = check_plan_gate(work_item_id, tree, commit=sha, **anchors) if plan else check_gate(
            work_item_id, tree=tree, commit=sha, **anchors)
    signed = ", ".join(f"{k} ({n})" for k, n in sorted(answer.signers.items())) or "none"
    if answer.passed:
        count = sum(answer.signers.values())
        click.echo(f"gate: {work_item_id} ASSERTed by {count} attestation(s); signed by key "
                   f"{signed}")
        if answer.recorded_by:
            click.echo(f"gate: recorded by {answer.recorded_by}")
    else:
        click.echo(f"gate: {work_item_id} refused" + (
            f"; signed by key {signed}" if answer.signers else ""))
        for problem in answer.problems:
            click.echo(f"  {problem}")
    if answer.trust:
        click.echo(f"gate: {answer.trust}")
    if vsa is not None:
        from choir.app.bundle import gate_envelope
        from choir.attest.standard import jsonl
        from choir.cli._render import write_whole

        write_whole(vsa, jsonl([gate_envelope(answer, resource_uri)]))
        click.echo(f"gate: verification summary ({'PASSED' if answer.passed else 'FAILED'}) "
                   f"written to {vsa}")
    if answer.first_use:
        click.echo("gate: note: no trusted keys were pinned; this home's own key was pinned on "
                   "first use. In CI set CHOIR_TRUSTED_KEYS=id1,id2.", err=True)
    return EXIT_OK if answer.passed else EXIT_FAIL
