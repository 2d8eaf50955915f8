"""The ``choir`` command: argument parsing and rendering only.

Subcommands live in their own modules and are imported only when invoked, so ``choir --help``
never pays for pydantic models, langgraph, litellm or docker. This module imports no click
either: a ``choir verify`` or ``choir run`` that a running ``choir serve`` answers sends its
command line as typed before anything else is imported (``main``), and the service's worker
parses it with the same click command the cold path would (``choir.cli._group``).
"""

from __future__ import annotations

import sys

from choir.serve import SERVED

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (2-8 ms on the warm
# path of `choir verify`); mypy reads any TYPE_CHECKING as true
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from choir.cli._group import cli as cli

# command name -> (module, attribute, one-line help shown by --help without importing it)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "verify": ("choir.cli.verify", "verify", "Verify the working tree now."),
    "init": ("choir.cli.init", "init", "Write a choir.yaml that fits this repo; verify once."),
    "runs": ("choir.cli.runs", "runs", "List past runs, or show one: reports, verdicts, logs."),
    "run": ("choir.cli.run", "run", "Run the orchestrator loop on a work item."),
    "approve": ("choir.cli.run", "approve", "Answer a human-approval gate."),
    "gate": ("choir.cli.run", "gate", "Exit 0 only if a work item is ASSERTed for this tree."),
    "audit": ("choir.cli.audit", "audit", "Re-verify every stored hash, signature and event."),
    "attest": ("choir.cli.audit", "attest", "Show attestations."),
    "ahdb": ("choir.cli.audit", "ahdb", "Inspect the AHDB control state."),
    "plan": ("choir.cli.plan", "plan", "Run a plan: many work items, one verified integration."),
    "promote": ("choir.cli.plan", "promote", "Fast-forward a branch to a plan ASSERTed tree."),
    "trace": ("choir.cli.trace", "trace", "Export a run's trace, or verify one."),
    "keys": ("choir.cli.keys", "keys", "Show, rotate or revoke the signing key."),
    "trust-interpreter": ("choir.cli.trust", "trust_interpreter",
                          "Trust the repo's interpreter as it is now (after pip install)."),
    "view": ("choir.cli.view", "view", "Browse runs, reports and attestations locally."),
    "mcp": ("choir.cli.mcp", "mcp", "Serve verify, reports and the gate to agents over MCP."),
    "serve": ("choir.cli.serve", "serve", "Keep Choir warm for verify and run (a local service)."),
}

# Commands that sign or read what a step or an executor wrote: their process signs through
# a broker and never sees the key folder (choir.trusted). `keys` manages the key itself.
# `view` must not even create a key: its broker starts only when the key exists (it signs
# DSSE exports), the folder is masked either way. `mcp` verifies and reads reports for an
# agent: separated like `verify`.
_SEPARATED = frozenset({"verify", "init", "run", "approve", "gate", "audit", "attest", "ahdb",
                        "trace", "runs", "trust-interpreter", "mcp", "plan", "promote", "serve",
                        "view"})
_NO_NEW_KEY = frozenset({"view"})
# Commands a running `choir serve` answers (SERVED): at the process entry their separation
# waits until the command knows it runs here, cold (`_warm` below).
# Flags that make a separated command only start or stop another process, reading nothing:
# that process separates itself (a confined parent would hand it a masked key folder).
_LAUNCHERS = {"serve": frozenset({"--detach", "--stop"})}
_deferred = False


def _separate(args: list[str]) -> None:
    """Start the signing broker, then hide the key from this process, before any work."""
    global _deferred
    name = next((a for a in args if not a.startswith("-")), None)
    if name not in _SEPARATED or _LAUNCHERS.get(name, frozenset()) & set(args) or \
            _shows_help(args):
        return
    if name in SERVED:
        _deferred = True
        return
    _separate_now(make_key=name not in _NO_NEW_KEY)


def _shows_help(args: list[str]) -> bool:
    """Whether click shows help for ``args`` rather than run a command: a ``-h`` or
    ``--help`` that is an option there, not an option's value (``--claim -h`` runs the
    command, with the key in reach had it not separated) nor a word after ``--``. Help runs
    nothing and needs no broker; click is imported only when such a word is there."""
    if not {"-h", "--help"} & set(args):
        return False
    import click

    from choir.cli._group import cli

    command: click.Command = cli
    ctx = click.Context(cli)
    takes: dict[str, int] = {}
    words = iter(args)
    for word in words:
        if word == "--":
            return False
        if word in ("-h", "--help"):
            return True
        if word.startswith("-"):
            for _ in range(takes.get(word, 0)):
                next(words, None)  # the option's value, whatever it looks like
        elif isinstance(command, click.Group):
            found = command.get_command(ctx, word)
            if found is None:
                return False  # click refuses it: a usage error, no command runs
            command = found
            takes = {name: max(param.nargs, 1) for param in command.params
                     if isinstance(param, click.Option) and not param.is_flag
                     and not param.count for name in (*param.opts, *param.secondary_opts)}
    return False


def _separate_now(*, make_key: bool = True) -> None:
    from choir.exceptions import ChoirError
    from choir.trusted import separate

    try:
        separate(make_key=make_key)
    except (ChoirError, OSError) as exc:
        _fail(str(exc))


def _fail(message: str) -> NoReturn:
    """Exit 2 saying why, as the CLI says a usage error (``choir.cli._errors``)."""
    sys.stderr.write(f"choir: error: {message}\n")
    sys.stderr.flush()
    sys.exit(2)


def _warm(args: list[str]) -> int | None:
    """The exit code of the command line ``args`` answered by a running ``choir serve``,
    or None: then this process separates, as every command that reads hostile bytes does,
    and the command runs cold. Asked at the process entry, before click or anything else is
    imported (about 35 ms a warm command does not pay): the service's worker parses ``args``
    with the same click command and runs it on this process's own descriptors, so what this
    terminal shows (usage errors, the live view, the table, the JSON) is what the command
    prints cold. ``CHOIR_SERVE=require`` with no service, or a worker lost after it took the
    request (nothing can safely run cold then), exits 2 saying why.
    """
    global _deferred
    if not _deferred:
        return None
    _deferred = False
    if args[0] not in SERVED:  # options before the command: not a line the service takes
        _separate_now()
        return None
    from choir._core.errors import UserError
    from choir._core.paths import home_dir
    from choir.serve import client

    try:
        mode, home = client.mode(), home_dir()
    except UserError as exc:
        _fail(str(exc))
    try:
        call, why = (None, "CHOIR_SERVE=off") if mode == "off" else \
            client.Call.start(home, {"argv": args})
    except KeyboardInterrupt:  # queued behind busy workers, and the user gave up
        return _aborted()
    if call is None:
        if mode == "require":
            _fail(f"CHOIR_SERVE=require: {why}")
        client.note(why if mode == "auto" else "")
        _separate_now()
        return None
    try:
        return call.wait()
    except KeyboardInterrupt:  # the worker sees the connection end: it stops, as cold would
        return _aborted()
    except client.Lost as exc:
        _fail(f"{exc}; whatever it recorded is in the stores (`choir runs`), and the command "
              "can be run again")
    finally:
        call.close()


def _aborted() -> int:
    """Ctrl-C while a service answers: what click says and exits with for it, cold."""
    sys.stderr.write("\nchoir: aborted\n")
    sys.stderr.flush()
    return 1


def __getattr__(name: str) -> Any:
    if name == "cli":  # the click group, imported on first use
        from choir.cli._group import cli

        return cli
    raise AttributeError(f"module 'choir.cli' has no attribute {name!r}")


def main(argv: list[str] | None = None) -> Any:
    """Entry point: user and configuration errors exit 2 with the message, never a traceback."""
    if argv is None:  # the process entry point: the process ends when the command does
        import atexit
        import gc

        # the interpreter's last garbage collection walks every object left (the imported
        # models and schemas): 80-450 ms after a `choir verify`, measured. Frozen objects are
        # skipped; the operating system frees the memory, and atexit handlers still run.
        atexit.register(gc.freeze)
        _separate(sys.argv[1:])
        code = _warm(sys.argv[1:])
        if code is not None:
            sys.exit(code)
        from choir._core import warm  # not before: `typing` costs a warm command 2-8 ms

        warm.memoize()  # one command in this process: its policy and plugins read once
    from choir.cli._errors import run_cli
    from choir.cli._group import cli as cli

    return run_cli(cli, argv if argv is not None else sys.argv[1:])
