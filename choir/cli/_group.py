"""The ``choir`` click group: its subcommands are imported only when invoked, so ``choir
--help`` never pays for pydantic models, langgraph, litellm or docker."""

from __future__ import annotations

import importlib

import click

from choir._version import __version__
from choir.cli import COMMANDS


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[cmd_name]
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="choir")
def cli() -> None:
    """Choir: agentic work that proves what it did.

    Exit codes: 0 success/PASS, 1 FAIL or violations, 2 usage or configuration error,
    3 waiting for human approval.
    """


__all__ = ["cli"]
