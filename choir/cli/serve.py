"""``choir serve``: keep Choir warm for ``choir verify``, ``choir run`` and ``choir mcp``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from choir.cli._errors import EXIT_FAIL, EXIT_OK

if TYPE_CHECKING:
    from choir.serve.worker import Command

DETACH_WAIT_S = 60.0
STOP_WAIT_S = 30.0


def _commands() -> dict[str, Command]:
    """The commands the service answers: a request's command line (``choir.serve.wire``)
    parsed by the same click group and run through the exit-code mapping of the CLI's
    entry point, as the cold command is."""
    from choir.cli._errors import exit_code
    from choir.cli._group import cli
    from choir.serve.worker import Command

    def line(r: Any) -> int:
        def parsed_and_run() -> Any:
            try:
                return cli.main(args=list(r.argv), prog_name="choir", standalone_mode=False)
            except SystemExit as exc:  # click's own exits (shell completion): their code
                return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        return exit_code(parsed_and_run)

    return {"verify": Command(line), "run": Command(line, interrupt=True)}


# What a `choir verify` and a `choir run` import after their entry (measured: the modules in
# sys.modules after one of each that were not before); optional ones are skipped when absent.
WARM_MODULES = (
    "choir.ahdb.signed", "choir.app.verify", "choir.attest.shared", "choir.cli._progress",
    "choir.cli._render", "choir.cli.run", "choir.cli.runs", "choir.cli.verify",
    "choir.config.database",
    "choir.config.store_url", "choir.distributed.fanout", "choir.graph.lease",
    "choir.graph.runner", "choir.postconditions.context", "choir.postconditions.drift",
    "choir.postconditions.spec", "choir.report.junit", "choir.sandbox.bwrap",
    "choir.sandbox.docker", "choir.sandbox.local", "choir.trace.step", "aiosqlite",
    "langchain_core.tracers.run_collector", "langchain_core.tracers.stdout",
    "langgraph.checkpoint.sqlite.aio", "rich._emoji_codes", "xml.etree.ElementTree",
    "docker",
)


def _warm_up() -> None:
    """Import what a request runs and fill the caches a cold command fills on every run,
    once, before the first worker is forked (``choir._core.warm``)."""
    import importlib

    from choir._core import registry, warm
    from choir.config.agents import executor_presets
    from choir.config.policy import load_packaged_policy
    from choir.config.presets import load_presets
    from choir.exceptions import ConfigError
    from choir.models._base import build_deferred
    from choir.sandbox._interpreter import preload as preload_interpreters

    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            continue  # an optional extra that is not installed: the request pays, as cold
    warm.enable()
    build_deferred()  # the models' validators, built at first use (choir.models._base)
    load_packaged_policy()
    preload_interpreters()  # each vouch's stat cache (choir.sandbox._interpreter)
    try:  # the verifier and executor presets (YAML parses: 4-12 ms a request, measured)
        load_presets()
        executor_presets()
    except ConfigError:
        pass  # a malformed plugin's preset: each request says so, as the cold command does
    for kind in (registry.SANDBOXES, registry.PARSERS, registry.REPORTERS, registry.EXECUTORS,
                 registry.PRESETS, registry.POSTCONDITIONS):
        kind.names()


@click.command()
@click.option("--detach", is_flag=True, help="Run in the background (output to "
                                             "$CHOIR_HOME/serve/log); return once it listens.")
@click.option("--stop", is_flag=True, help="Stop the service of this CHOIR_HOME (requests "
                                           "it is answering finish first).")
@click.option("--jobs", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Requests answered side by side; more wait their turn.")
@click.option("--idle-timeout", "idle_timeout_s", type=click.FloatRange(0, 7 * 86400),
              default=1800, show_default=True,
              help="Seconds without a request after which it exits (0: never).")
@click.option("--ready-fd", type=int, default=None, hidden=True)
def serve(detach: bool, stop: bool, jobs: int, idle_timeout_s: float,
          ready_fd: int | None) -> int:
    """Keep imports, sandbox launchers and stores warm behind an owner-only local socket.

    `choir verify` and `choir run` use it when it runs and answer exactly as they would
    without it (same output, exit code and attestations); when it is absent or stale (other
    code, another CHOIR_HOME) they run as before. CHOIR_SERVE=off never asks it;
    CHOIR_SERVE=require fails when it does not answer.
    """
    from choir._core.paths import choir_home

    home = choir_home()
    if stop:
        return _stop(home)
    if detach:
        return _detach(home, jobs, idle_timeout_s)
    from choir.serve.server import start

    _confined(home)
    _warm_up()
    if ready_fd is None:
        click.echo(f"choir serve: listening for {home} (pid {os.getpid()}, {jobs} at a time); "
                   "Ctrl-C or `choir serve --stop` ends it", err=True)
    start(home, _commands(), jobs=jobs, idle_timeout_s=idle_timeout_s, ready=ready_fd)
    return EXIT_OK


def _confined(home: Path) -> None:
    """Refuse to serve where the key folder could not be hidden (confinement ``process``,
    ``choir.trusted.confine``): the service's workers, and every step or executor they run
    unsandboxed, could read the signing key. Review 21a: a service started without
    ``CAP_SYS_ADMIN`` served normal clients, and a step read the key.

    Raises:
        UserError: it is not ``mount-namespace`` or ``user-namespace``.
    """
    from choir.exceptions import UserError
    from choir.trusted.confine import confinement, why_process

    keys = home.absolute() / "keys"
    level = confinement(keys)
    if level in ("mount-namespace", "user-namespace"):
        return
    why = why_process(keys) or "it was never confined"
    raise UserError(
        f"choir serve cannot hide its key folder {keys} here (confinement {level or 'none'}: "
        f"{why}), so the steps it runs could read the signing key\n"
        "  fix: start `choir serve` where a mount namespace can be made (as root with "
        "CAP_SYS_ADMIN, or as a user where unprivileged user namespaces are allowed: "
        "`unshare --user --mount true` succeeds), not under a unit or `setpriv` that drops "
        "those; without it, commands run cold (CHOIR_SERVE=off)")


def _stop(home: Path) -> int:
    from choir.serve.server import running_pid

    pid = running_pid(home)
    if pid is None:
        click.echo(f"choir serve: none runs for {home}")
        return EXIT_FAIL
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while running_pid(home) == pid and time.monotonic() < deadline:
        time.sleep(0.05)
    if running_pid(home) == pid:
        click.echo(f"choir serve: pid {pid} did not stop within {STOP_WAIT_S:g} s")
        return EXIT_FAIL
    click.echo(f"choir serve: stopped (pid {pid})")
    return EXIT_OK


def _detach(home: Path, jobs: int, idle_timeout_s: float) -> int:
    """Start ``choir serve`` in a session of its own and wait until it listens."""
    from choir.exceptions import UserError
    from choir.serve import place
    from choir.serve.server import running_pid

    fd = place.open_folder(home, create=True)
    assert fd is not None
    try:
        log = os.open(place.LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                      | os.O_CLOEXEC, 0o600, dir_fd=fd)
    finally:
        os.close(fd)
    read, write = os.pipe()
    try:
        # -P: not the working directory first on the import path (``-m`` puts it there): a
        # service started in a repo would import what an executor planted in it
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "choir", "serve", "--jobs", str(jobs), "--idle-timeout",
             str(idle_timeout_s), "--ready-fd", str(write)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(write,),
            start_new_session=True)
    finally:
        os.close(write)
        os.close(log)
    with os.fdopen(read, "rb") as ready:
        import select

        got = select.select([ready], [], [], DETACH_WAIT_S)[0] and ready.readline()
    if got != b"ready\n":
        code = proc.poll()
        ended = f"exit {code}" if code is not None else "no answer"
        raise UserError(f"choir serve did not start ({ended}); see "
                        f"{place.folder(home) / place.LOG}")
    click.echo(f"choir serve: listening for {home} (pid {running_pid(home) or proc.pid})")
    return EXIT_OK
