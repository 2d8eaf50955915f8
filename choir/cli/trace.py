"""``choir trace export RUN_ID [-o FILE]`` and ``choir trace verify FILE [--json]``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from choir.cli._errors import EXIT_FAIL, EXIT_OK


@click.group()
def trace() -> None:
    """Run traces: export one as JSON, or verify one (docs/trace.md)."""


@trace.command("export")
@click.argument("run_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the trace here instead of stdout.")
@click.option("--agent-store", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="A durable Agent run: the SqliteContextStore file it saved to.")
def trace_export(run_id: str, output: Path | None, agent_store: Path | None) -> int:
    """Build the trace of a `choir run` (or a durable Agent run) from what it stored."""
    from pydantic import ValidationError

    from choir.evidence.artifacts import ArtifactStore
    from choir.exceptions import UserError
    from choir.trace import export_run

    try:
        if agent_store is not None:
            from choir.agent import SqliteContextStore
            from choir.trace.agent import export_agent

            trace = export_agent(run_id, SqliteContextStore(agent_store), ArtifactStore())
        else:
            trace = export_run(run_id)
    except ValidationError as err:  # a bound of the format (docs/trace.md), not a crash
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "$"
        raise UserError(f"run {run_id!r}: its trace cannot be built ({err.error_count()} "
                        f"problem(s) in the {err.title}; {where}: {first['msg'][:300]}), so "
                        "none was written; `choir audit` names what it holds against the "
                        "run, and still checks its evidence through its attestations and "
                        "manifests") from None
    text = trace.model_dump_json(indent=1)
    if output is None:
        click.echo(text)
    else:
        tmp = output.with_name(f".{output.name}.tmp")
        tmp.write_text(text + "\n")
        tmp.replace(output)
    return EXIT_OK


@trace.command("verify")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def trace_verify(file: Path, as_json: bool) -> int:
    """Check a trace, and hold it against this home's stores: exit 0 when every check
    passes, 1 when any fails."""
    from choir.trace import verify_trace_file
    from choir.trace.grounding import RecordSources

    sources = RecordSources.of_home()
    result = verify_trace_file(file, sources.store, sources=sources)
    if as_json:
        click.echo(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        for f in result.failures:
            click.echo(f"FAIL {f.check}: {f.where}: {f.detail}")
        for c in result.checks:
            click.echo(f"{'pass' if c.passed else 'FAIL'}  {c.name}")
        metrics = ", ".join(f"{k} {v}" for k, v in sorted(result.summary_metrics.items()))
        click.echo(f"trace: {'verified' if result.ok else 'REJECTED'} ({metrics})")
    return EXIT_OK if result.ok else EXIT_FAIL
