"""``choir-ci``: Choir where the pull request is (the GitHub Action, the pre-commit hook).

``choir-ci github`` is the entry of ``action.yml``: it verifies the checked-out tree, bundles
the evidence, gates the claim, writes the step summary, annotations and outputs, and fails the
step unless the tree passed and the gate opened. ``choir-ci pre-commit`` is the hook's entry
(``.pre-commit-hooks.yaml``): the same run, its summary as plain text. The steps are in
``steps.py``; how hostile text is kept from driving the runner is in ``github.py`` and
``summary.py``. Options come from the command line or ``CHOIR_CI_*`` variables (the action
sets those from its inputs, never by pasting inputs into a script).
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from choir._core.errors import UserError
from choir.ci import github
from choir.ci.steps import SUMMARY, Options, run, upload_paths, write_new
from choir.ci.summary import Outcome, markdown, plain

_MOODS = ["CALM", "SKEPTICAL", "PARANOID", "BOLD", "CURIOUS"]
# the action's inputs, each passed as CHOIR_CI_<NAME> (action.yml)
_INPUTS = ("repo", "mood", "claim", "sandbox", "resource-uri", "base-ref",
           "approve-spec-change")


class _Input(click.Option):
    """An option the action and the hook set through a ``CHOIR_CI_*`` variable: a value
    there that does not fit says so by the variable's name and the action's input, which is
    what the workflow's author wrote (click names only the option, which they never typed);
    in the GitHub step it is an error annotation too. Exit 2, as every usage error."""

    def type_cast_value(self, ctx: click.Context, value: Any) -> Any:
        try:
            return super().type_cast_value(ctx, value)
        except click.BadParameter as exc:
            source = ctx.get_parameter_source(self.name or "")
            if source is not click.core.ParameterSource.ENVIRONMENT or \
                    not isinstance(self.envvar, str):
                raise
            name = self.envvar.removeprefix("CHOIR_CI_").lower().replace("_", "-")
            where = f" (the action's `{name}` input)" if name in _INPUTS else ""
            message = f"{self.envvar}={str(value)[:200]!r}{where}: {exc.message}"
            if ctx.info_name == "github":
                print(github.annotation("error", message, title="choir: a bad input"),
                      flush=True)
            raise click.UsageError(message, ctx) from None


_input = functools.partial(click.option, cls=_Input)


def _options(fn: Any) -> Any:
    for option in reversed([
        _input("--repo", envvar="CHOIR_CI_REPO", default=".", show_default=True,
                     type=click.Path(path_type=Path, file_okay=False),
                     help="The repo to verify (holds choir.yaml)."),
        _input("--mood", envvar="CHOIR_CI_MOOD", default=None,
                     type=click.Choice(_MOODS, case_sensitive=False)),
        _input("--claim", envvar="CHOIR_CI_CLAIM", default=None,
                     help="The claim verified and gated (default: ci, pre-commit)."),
        _input("--sandbox", envvar="CHOIR_CI_SANDBOX", default=None,
                     help="docker | bwrap | local | auto (default: choir.yaml, else auto)."),
        _input("--out", envvar="CHOIR_CI_OUT", default=None,
                     type=click.Path(path_type=Path, file_okay=False),
                     help="Where the bundle, the VSA, the key and the contract are written."),
        _input("--resource-uri", "resource_uri", envvar="CHOIR_CI_RESOURCE_URI",
                     default=None, help="The VSA's resourceUri (in GitHub: the repository "
                     "and ref)."),
        _input("--base-ref", "base_ref", envvar="CHOIR_CI_BASE_REF", default=None,
                     help="Verify with this commit's choir.yaml and checks, not the tree's "
                     "(in GitHub: the pull request's base)."),
        _input("--approve-spec-change", "approve_spec",
                     envvar="CHOIR_CI_APPROVE_SPEC_CHANGE",
                     is_flag=True, default=False,
                     help="A person approved the tree's changes to the base's checks."),
    ]):
        fn = option(fn)
    return fn


def _opts(repo: Path, mood: str | None, claim: str, sandbox: str | None, out: Path,
          resource_uri: str | None, base_ref: str | None = None,
          approve_spec: bool = False) -> Options:
    if approve_spec and not base_ref:
        raise click.UsageError("--approve-spec-change approves a change to the base's "
                               "checks; set --base-ref (CHOIR_CI_BASE_REF) too")
    return Options(repo=repo.resolve(), out=Path(os.path.abspath(out)), claim=claim,
                   mood=mood.upper() if mood else None, sandbox=sandbox or None,
                   resource_uri=resource_uri or None, base=base_ref or None,
                   approve_spec=approve_spec)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Verify and gate a tree in CI: exit 0 only when it passed and the gate opened,
    1 otherwise, 2 when nothing could be verified (a configuration error)."""


@main.command("github")
@_options
def github_action(repo: Path, mood: str | None, claim: str | None, sandbox: str | None,
                  out: Path | None, resource_uri: str | None, base_ref: str | None,
                  approve_spec: bool) -> None:
    """The GitHub Action's step (reads the GITHUB_* variables the runner sets)."""
    env = os.environ
    claim = claim or "ci"
    out = out or Path(env.get("RUNNER_TEMP") or ".") / "choir-ci"
    if not resource_uri and env.get("GITHUB_REPOSITORY"):
        server = env.get("GITHUB_SERVER_URL") or "https://github.com"
        ref = f"@{env['GITHUB_REF']}" if env.get("GITHUB_REF") else ""
        resource_uri = f"git+{server}/{env['GITHUB_REPOSITORY']}{ref}"
    # the checked-out tree is a pull request's: its choir.yaml never picks `local` here
    opts = replace(_opts(repo, mood, claim, sandbox, out, resource_uri, base_ref, approve_spec),
                   isolated=True)
    print(github.defuse(f"choir: verifying {opts.repo} as claim {claim}"), flush=True)
    if opts.base is None:
        print(github.annotation(
            "warning", "no base-ref: the tree's own choir.yaml and tests decided this check, "
            "and a pull request may edit both; set the action's base-ref input (the default "
            "on pull_request events) to verify with the base branch's",
            title="choir: the checks are the tree's own"), flush=True)
    try:
        outcome = run(opts, lambda lines: github.relay(sys.stdout, lines))
    except UserError as exc:  # nothing verified: the step says why, as an error annotation
        print(github.annotation("error", str(exc), title="choir: configuration error"))
        sys.exit(2)
    _report_github(outcome, opts)
    sys.exit(outcome.exit_code)


def _report_github(outcome: Outcome, opts: Options) -> None:
    """The log (tail in a group, commands stopped), annotations, step summary, outputs."""
    env, out = os.environ, sys.stdout
    contract = outcome.contract or {}
    reported = False  # until the log and the summary are written: a crash there is ERROR
    try:
        tail = str(contract.get("tail_log") or outcome.error)
        if tail:
            out.write("::group::choir: the tail of the logs (the verifiers' own output)\n")
            github.relay(out, tail.splitlines())
            out.write("::endgroup::\n")
        for line in error_annotations(outcome, opts):
            out.write(line + "\n")
        text = markdown(outcome, claim=opts.claim)
        write_new(opts.out / SUMMARY, text.encode("utf-8", "backslashreplace"))
        if env.get("GITHUB_STEP_SUMMARY"):
            with open(env["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8",
                      errors="backslashreplace") as fh:
                fh.write(text)
        reported = True
    finally:  # the outputs, whatever happened above: the upload step needs ``paths``
        if env.get("GITHUB_OUTPUT"):
            github.write_outputs(Path(env["GITHUB_OUTPUT"]), {
                "status": outcome.status if reported else "ERROR",
                "run-id": _plain(contract.get("run_id")),
                "gate": "open" if outcome.gate_open and reported else "refused",
                "bundle": outcome.bundle or "",
                "key-id": outcome.key_id or "",
                "paths": upload_paths(outcome, opts.out),
            })
    out.write(f"choir: {outcome.status}\n")
    out.flush()


def _plain(value: object) -> str:
    text = str(value or "")
    return text if text.isprintable() else ""


def error_annotations(outcome: Outcome, opts: Options) -> list[str]:
    """One error per failing test (at its file and line, when that is a file of the repo),
    one per verifier that did not pass without one, one for a configuration error."""
    from choir._core.terminal import one_line
    from choir.ci.summary import report_rows

    if outcome.contract is None:
        return [github.annotation("error", one_line(outcome.error, 1500),
                                  title="choir verify: configuration error")]
    found: list[str] = []
    base = outcome.contract.get("base")
    if isinstance(base, dict) and base.get("blocked"):
        found.append(github.annotation("error", one_line(base["blocked"], 1500),
                                       title="choir: the base's checks were changed"))
    tested: set[str] = set()
    seen: set[tuple[str, str]] = set()  # a test failing in a run and its twin: once
    for test in (outcome.contract.get("failing_tests") or [])[:20]:
        key = (str(test.get("node_id")), str(test.get("location")))
        tested.add(str(test.get("verifier")))
        if key in seen or len(seen) >= 10:
            continue
        seen.add(key)
        file, line = repo_location(test.get("location"), opts.repo)
        found.append(github.annotation(
            "error", f"{one_line(test.get('node_id'))}: {one_line(test.get('excerpt') or '')}",
            title=f"choir: {one_line(test.get('verifier'), 64)} failed", file=file, line=line))
    for name, result, summary in report_rows(outcome.contract):
        if result != "PASS" and name.rsplit("#", 1)[0] not in tested:
            found.append(github.annotation("error", one_line(summary),
                                           title=f"choir: {one_line(name, 64)} {result}"))
    if outcome.gate_code is not None and not outcome.gate_open and not found:
        found.append(github.annotation("error", " ".join(outcome.gate_lines)[:1500],
                                       title=f"choir gate {opts.claim}: refused"))
    return found[:20]


def repo_location(location: object, repo: Path) -> tuple[str | None, int | None]:
    """``path:line`` from a report as a path GitHub can annotate (relative to the workspace),
    only when it names a regular file inside the repo; else (None, None)."""
    if not isinstance(location, str) or not location or len(location) > 512:
        return None, None
    path, _, line = location.partition(":")
    parts = Path(path).parts
    if not parts or Path(path).is_absolute() or ".." in parts:
        return None, None
    target = repo / path
    if target.is_symlink() or not target.is_file():
        return None, None
    workspace = Path(os.environ.get("GITHUB_WORKSPACE") or repo).resolve()
    try:
        shown = target.relative_to(workspace).as_posix()
    except ValueError:
        shown = path
    # ASCII digits only: "²" is a digit to ``isdigit`` and no number to ``int`` (a review's
    # crash: a test printed ``FAILED data.txt:²``)
    return shown, int(line) if line.isascii() and line.isdigit() and len(line) < 10 else None


@main.command("pre-commit")
@_options
def pre_commit(repo: Path, mood: str | None, claim: str | None, sandbox: str | None,
               out: Path | None, resource_uri: str | None, base_ref: str | None,
               approve_spec: bool) -> None:
    """The pre-commit hook: verify and gate the tree about to be committed."""
    from choir._core.paths import choir_home
    from choir._core.terminal import one_line

    claim = claim or "pre-commit"
    opts = _opts(repo, mood, claim, sandbox, out or choir_home() / "ci" / claim, resource_uri,
                 base_ref, approve_spec)

    def progress(lines: list[str]) -> None:
        for line in lines:
            print(one_line(line, 200), file=sys.stderr, flush=True)

    try:
        outcome = run(opts, progress)
    except UserError as exc:
        print(f"choir-ci: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(plain(outcome, claim=claim))
    sys.exit(outcome.exit_code)
