"""``choir trust-interpreter``: thin wrapper over ``choir.verification.trust_interpreter``."""

from __future__ import annotations

from pathlib import Path

import click

from choir.cli._errors import EXIT_OK


@click.command("trust-interpreter")
@click.option("--repo", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="The repo whose verifiers' interpreter to trust (holds choir.yaml).")
@click.option("--sandbox", "sandbox_name", default=None,
              help="docker | bwrap | local | auto (default: choir.yaml, else auto).")
def trust_interpreter(repo: Path, sandbox_name: str | None) -> int:
    """Record the interpreter the verifiers run, re-hashed now, as trusted for this repo.

    Run it after changing the repo's venv yourself: a venv that changed since it was trusted
    is refused (exit 2), since an executor may have planted code there.
    """
    from choir.config import load_repo_config
    from choir.verification import trust_interpreter as trust

    found = trust(load_repo_config(repo), sandbox_name)
    if found is None:
        click.echo("the sandbox runs its image's own interpreter: nothing to trust here")
    else:
        click.echo(f"trusted {found.venv or found.python}: {found.files} paths, "
                   f"digest {found.digest} ({found.scope})")
    return EXIT_OK
