"""Turn Choir's user errors into exit code 2 with a clear message, everywhere."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_APPROVAL, EXIT_INCONCLUSIVE = 0, 1, 2, 3, 4
OTEL_HELP = ("Emit OpenTelemetry spans over OTLP/HTTP (also CHOIR_OTEL=1; the endpoint from "
             "OTEL_EXPORTER_OTLP_ENDPOINT); needs pip install 'choir[otel]'.")


def show_error(error: dict[str, Any]) -> int:
    """A command's failure as ``choir serve`` reported it, shown as the cold command shows
    it: a user error exits 2 with its message (``run_cli``), a crash prints its traceback
    and exits 1."""
    from choir.exceptions import UserError

    if not error.get("crash"):
        raise UserError(str(error.get("message", "")))
    sys.stderr.write(str(error.get("message", "")))
    return EXIT_FAIL


def run_cli(cli: click.Group, argv: list[str]) -> NoReturn:
    from choir.exceptions import UserError

    try:
        rv: Any = cli.main(args=argv, prog_name="choir", standalone_mode=False)
    except UserError as exc:
        click.echo(f"choir: error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        click.echo("choir: aborted", err=True)
        sys.exit(EXIT_FAIL)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)
