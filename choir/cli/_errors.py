"""Turn Choir's user errors into exit code 2 with a clear message, everywhere."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_APPROVAL, EXIT_INCONCLUSIVE = 0, 1, 2, 3, 4
OTEL_HELP = ("Emit OpenTelemetry spans over OTLP/HTTP (also CHOIR_OTEL=1; the endpoint from "
             "OTEL_EXPORTER_OTLP_ENDPOINT); needs pip install 'choir[otel]'.")


def run_cli(cli: click.Group, argv: list[str]) -> NoReturn:
    sys.exit(exit_code(lambda: cli.main(args=argv, prog_name="choir", standalone_mode=False)))


def exit_code(command: Callable[[], Any]) -> int:
    """Run a command and return its exit code, saying why on stderr when it is a usage
    error: the CLI's entry point, and a worker of ``choir serve`` running a command."""
    from choir.exceptions import (
        IntegrityError,
        NotFoundError,
        PromotionError,
        SandboxError,
        UserError,
    )

    try:
        _check_homes()
        rv: Any = command()
    except UserError as exc:
        click.echo(f"choir: error: {exc}", err=True)
        return EXIT_USAGE
    except NotFoundError as exc:  # an id asked for that is not stored (a typo, mostly)
        click.echo(f"choir: error: {exc}", err=True)
        return EXIT_USAGE
    except PromotionError as exc:  # the promotion rules refused the write: nothing changed
        click.echo(f"choir: refused: {exc}", err=True)
        return EXIT_FAIL
    except SandboxError as exc:  # infrastructure, not the work: nothing is decided on it
        click.echo(f"choir: infrastructure: {exc}; the run can be resumed "
                   "(`choir run --resume RUN_ID`) once it works", err=True)
        return EXIT_INCONCLUSIVE
    except IntegrityError as exc:  # the store refused (e.g. a log no trusted head covers)
        click.echo(f"choir: refused: {exc}", err=True)
        return EXIT_FAIL
    except (click.exceptions.Abort, KeyboardInterrupt):
        # the steps and the executor run in sandboxes of their own sessions: killed now, or
        # the interpreter would wait for their threads at exit, and an executor's change
        # would land after the user gave up (review 16c)
        from choir.sandbox.stop import stop_steps

        stop_steps()
        click.echo("choir: aborted", err=True)
        return EXIT_FAIL
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - a fault of Choir's own, never a verdict
        # exit 1 is a verdict (halted, FAIL, refused): a crash read as one would tell a
        # script the work failed when nothing was decided (review 17d)
        import traceback

        traceback.print_exc()
        click.echo(f"choir: internal error: {type(exc).__name__}: {str(exc)[:300]}; nothing "
                   "was decided on it (a run can be resumed: `choir run --resume RUN_ID`); "
                   "please report it with the traceback above", err=True)
        return EXIT_INCONCLUSIVE
    return rv if isinstance(rv, int) else EXIT_OK


def _check_homes() -> None:
    """``CHOIR_HOME`` and ``CHOIR_ARTIFACT_DIR`` name folders when they exist (one that is a
    file failed deep inside a command, with a traceback: review 16c).

    Raises:
        UserError: one names something that is not a folder.
    """
    import os
    import stat

    from choir.exceptions import UserError

    for var in ("CHOIR_HOME", "CHOIR_ARTIFACT_DIR"):
        value = os.environ.get(var)
        if not value:
            continue
        try:
            mode = os.stat(os.path.expanduser(value)).st_mode
        except OSError:
            continue  # absent: made when needed; unreadable: said where it is used
        if not stat.S_ISDIR(mode):
            raise UserError(f"{var}={value} is not a folder\n  fix: point {var} at a folder "
                            "(it is made when missing), or unset it")
