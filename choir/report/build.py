"""From a finished run to a bounded VERIFICATION_REPORT.

RESULT comes from evidence only: exit codes, timeouts, OOM, sandbox errors and what the
parser read. The optional cheap model may word the summary and next actions, lower
confidence or mark the run INCONCLUSIVE; it can never raise a result (model.py clamps it).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import signal
import threading
from typing import TYPE_CHECKING, Any

from choir import llm
from choir._core.registry import REPORTERS
from choir._core.terminal import shorten
from choir.models import (
    Counts,
    Result,
    Target,
    VerificationReport,
    VerifierHistory,
    VerifierKind,
    VerifierSpec,
)
from choir.models.report import NEXT_ACTION_MAX, SUMMARY_MAX
from choir.report.bound import fit, unlisted_note
from choir.report.confidence import TABLE, calibrate
from choir.report.parsers import ParseInput, ParseResult, get_parser
from choir.report.postcondition import decide_postcondition
from choir.report.reporter import bounded, fallback, windows

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore
    from choir.verification.pipeline import PipelineResult

ARTIFACTS_MAX = 16  # VerificationReport.artifacts holds at most this many entries
_STRUCTURED = {"junit", "sarif"}
# parsers whose result, unread, decides nothing: pytest's summary line is text the code under
# test can print too, so it never outweighs a cut log (``decide``), but one never reached is
# no PASS (review 17f: ``os._exit(0)`` before the failing test)
_DECLARED = {*_STRUCTURED, "pytest"}
_TESTS = {"junit", "pytest"}  # parsers that count tests: a PASS needs one that ran

# Exit codes with which a tool says it could not run the checks (its own crash or misuse),
# not that the checks found a bug: INCONCLUSIVE, so the executor never chases a phantom bug.
TOOL_CRASHES: dict[str, dict[int, str]] = {
    "pytest": {2: "pytest interrupted", 3: "pytest internal error", 4: "pytest usage error",
               5: "no tests collected"},
    "ruff": {2: "ruff could not run"},
    "mypy": {2: "mypy could not run"},
}
_RUNNERS = {"python", "python3", "uv", "poetry", "pipenv", "hatch", "pdm", "run", "exec"}


def tool_of(command: str) -> str | None:
    """The tool a step runs (``pytest``, ``ruff``, ``mypy``), read from its command line:
    ``pytest ...``, ``/venv/bin/ruff ...``, ``python -m mypy ...``, ``uv run pytest ...``."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    expect_module = False
    for word in words[:8]:
        if word == "$CHOIR_PYTEST":  # python3 -c "$CHOIR_PYTEST": the pytest preset's step
            return "pytest"
        if "=" in word and not word.startswith("-"):
            continue  # VAR=value before the command
        base = word.rsplit("/", 1)[-1]
        if expect_module or base in TOOL_CRASHES:
            return base if base in TOOL_CRASHES else None
        if word == "-m":
            expect_module = True
            continue
        if base.startswith("python") or base in _RUNNERS or word.startswith("-"):
            continue
        return None
    return None


def decide(result: PipelineResult, parsed: ParseResult, parser: str,
           steps: int | None = None) -> tuple[Result, str]:
    """The verdict and the reason, from evidence alone.

    ``steps`` is how many steps the verifier declares: the last one is the one that
    promised the structured evidence (JUnit XML) the parser reads. A log cut at
    ``limits.out_mb`` hides what a log parser would have read (the failures, the summary):
    such a run PASSes only when a complete structured result (JUnit XML, SARIF read
    without error) decides, else it is INCONCLUSIVE; the reason names the cut either way.
    """
    verdict, reason = _decide_steps(result, parsed, parser, steps)
    cut = next((r for r in result.manifest.commands_executed if r.output_cut), None)
    if cut is None:
        return verdict, reason
    note = (f"the log was cut: {cut.output_cut} bytes of step {cut.name} not kept "
            "(limits.out_mb)")
    if verdict is not Result.PASS:
        return verdict, f"{reason}; {note}"
    if parser in _STRUCTURED and not parsed.error:
        return verdict, f"{reason} and {parser} read a complete result, although {note}"
    return Result.INCONCLUSIVE, (f"{note}, and no complete structured result decides: raise "
                                 "limits.out_mb, or write JUnit XML to $CHOIR_OUT (parser: "
                                 "junit)")


def _decide_steps(result: PipelineResult, parsed: ParseResult, parser: str,
                  steps: int | None) -> tuple[Result, str]:
    if result.infra_error:
        return Result.INCONCLUSIVE, f"the sandbox failed: {result.infra_error[:200]}"
    if parser == "postcondition":  # exit codes 0/1/3 from the harness; any other fault:
        return decide_postcondition(result, parsed)  # INCONCLUSIVE
    records = result.manifest.commands_executed
    counts = parsed.counts
    for index, rec in enumerate(records):
        if rec.timed_out:
            return Result.FAIL, f"step {rec.name} timed out after {rec.duration_ms} ms"
        if rec.oom_killed:
            return Result.FAIL, f"step {rec.name} was killed: out of memory"
        if rec.limit_exceeded:
            return Result.FAIL, f"step {rec.name} was stopped: {rec.limit_exceeded}"
        if rec.exit_code != 0:
            tool = tool_of(rec.command) or ""
            crash = TOOL_CRASHES.get(tool, {}).get(rec.exit_code)
            if tool == "pytest" and rec.exit_code == 2 and (counts.errors or 0) > 0:
                # pytest also exits 2 on collection errors: the code under test does not
                # import (a syntax error the executor made). That is a bug to fix, not a crash.
                return Result.FAIL, f"step {rec.name}: pytest could not collect the tests " \
                                    f"(exit 2): errors during collection"
            if (counts.failed or 0) > 0:
                # the tests ran and some failed: the code under test picks the exit code it
                # leaves with (an atexit, a plugin; 127 or a crash code) and what it prints
                # ("No module named ..."), so neither can hide them (reviews 17b, 17f)
                return Result.FAIL, (f"step {rec.name} exited {rec.exit_code} after "
                                     f"{counts.failed} test(s) failed")
            if rec.exit_code == 127:
                return Result.INCONCLUSIVE, (f"step {rec.name}: command not found (exit 127):"
                                             " the checks did not run")
            if tool and rec.exit_code == 1 and _no_module(tool, result.tail_log):
                return Result.INCONCLUSIVE, (f"step {rec.name}: {tool} is not installed in the"
                                             " project's interpreter: the checks did not run")
            if rec.exit_code < 0 or 128 < rec.exit_code < 128 + 65 and not crash:  # NSIG
                # killed by a signal (a segfault in the code under test, a C extension, a
                # stack overflow in C): a bug of the code, for the executor to hear of
                number = -rec.exit_code if rec.exit_code < 0 else rec.exit_code - 128
                return Result.FAIL, (f"step {rec.name} was killed by signal {number} "
                                     f"({_signal_name(number)})")
            if crash:
                return Result.INCONCLUSIVE, (f"step {rec.name}: {crash} (exit {rec.exit_code}):"
                                             " the checks did not run")
            last = steps is None or index == steps - 1
            if last and parser == "junit" and parsed.error and "no JUnit XML" in parsed.error:
                return Result.INCONCLUSIVE, (f"step {rec.name} exited {rec.exit_code} and wrote"
                                             " no JUnit XML to $CHOIR_OUT (parser: junit)")
            return Result.FAIL, f"step {rec.name} exited {rec.exit_code}"
    if (counts.failed or 0) > 0 or (counts.errors or 0) > 0 or parsed.signatures:
        return Result.FAIL, "the parser found failures although every step exited 0"
    if parser in _DECLARED and parsed.error:
        return Result.INCONCLUSIVE, f"declared evidence unreadable: {parsed.error[:200]}"
    if not records:
        return Result.INCONCLUSIVE, "no step ran"
    if parser in _TESTS and (parsed.ran or 0) <= 0:
        # every test skipped (a SkipTest the code under test raises in the call), or none
        # counted: a PASS here would cover nothing (review 17f)
        return Result.INCONCLUSIVE, (f"every step exited 0, but no test ran to an outcome "
                                     f"({counts.run or 0} counted, {counts.skipped or 0} "
                                     "skipped or xfailed): nothing was checked")
    return Result.PASS, "every step exited 0"


def _no_module(tool: str, log: str) -> bool:
    """Whether the interpreter said it has no ``tool`` module: its own line, ending there
    (a failing test's message naming ``pytest_myplugin`` is not that: review 17f)."""
    return re.search(rf"(?m)(?:^|: )No module named '?{re.escape(tool)}'?\s*$", log) is not None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _counts_text(counts: Counts) -> str:
    parts = [f"{v} {k}" for k, v in counts.model_dump().items() if v is not None]
    return ", ".join(parts)


def deterministic_report(result: PipelineResult, *, spec: VerifierSpec, target: Target,
                         parsed: ParseResult, verdict: Result, reason: str,
                         lens: str = "default",
                         history: VerifierHistory | None = None) -> VerificationReport:
    counts = _counts_text(parsed.counts)
    listed, unlisted = _listed_artifacts(result)
    summary = f"{spec.name}: {verdict.value}: {reason}" + (f" ({counts})" if counts else "")
    if parsed.dropped:
        summary += f"; {parsed.dropped} more failure signature(s) not listed"
    if unlisted:
        summary += unlisted_note(unlisted)
    if verdict is Result.PASS:
        actions = ["No action needed: every step passed."]
    elif verdict is Result.INCONCLUSIVE and result.infra_error:
        actions = ["Rerun in a working sandbox; this run proves nothing either way."]
    elif verdict is Result.INCONCLUSIVE and "the log was cut" in reason:
        actions = ["Raise limits.out_mb or make the step print less, or have it write JUnit "
                   "XML to $CHOIR_OUT (parser: junit): a cut log proves nothing either way."]
    elif verdict is Result.INCONCLUSIVE and spec.kind is VerifierKind.POSTCONDITION:
        actions = ["The action's effect could not be verified (no answer in time, or the "
                   "check itself broke): check the resource and the verifier, then rerun."]
    elif verdict is Result.INCONCLUSIVE:
        actions = ["Fix the verifier's command or configuration in choir.yaml: the tool did "
                   "not run the checks, so this run proves nothing either way."]
    else:
        actions = [shorten(f"Fix {s.test_id or s.kind}: {s.excerpt}", NEXT_ACTION_MAX)
                   for s in parsed.signatures[:3]] or [
            shorten(f"Make step '{reason}' succeed; read the cited log lines.", NEXT_ACTION_MAX)]
    hyper: list[str] = []
    isolation = result.manifest.platform.isolation
    if isolation == "none":
        hyper.append("Ran without a sandbox (isolation none): the environment may be adversarial.")
    if verdict is Result.PASS and parsed.counts.run == 0:
        hyper.append("No test was collected: a PASS here covers nothing.")
    if parsed.truncated:
        hyper.append("Parser output was truncated; unlisted failures may exist.")
    if verdict is Result.INCONCLUSIVE:
        hyper.append("Inconclusive: cannot rule out either outcome.")
    confidence, basis = calibrate(verdict, isolation=isolation, lens=lens, history=history)
    if history is not None or confidence < TABLE[verdict] and isolation != "none":
        hyper = [*hyper[:3], basis]
    return fit(VerificationReport.model_construct(
        verifier=spec.name, verifier_type=spec.kind.value, target=target, result=verdict,
        failure_signatures=tuple(parsed.signatures), signatures_truncated=parsed.dropped,
        summary=shorten(summary, SUMMARY_MAX), next_actions=tuple(actions[:3]),
        confidence=confidence, hyperthesis=tuple(hyper[:4]), counts=parsed.counts,
        parser=spec.parser, parser_truncated=parsed.truncated,
        artifacts=listed, log_cut_bytes=_cut_bytes(result),
    ))


def _cut_bytes(result: PipelineResult) -> int:
    """Bytes of output the run's steps printed past ``limits.out_mb`` and did not keep."""
    return sum(r.output_cut or 0 for r in result.manifest.commands_executed)


def _listed_artifacts(result: PipelineResult) -> tuple[dict[str, str], int]:
    """The artifacts a report names (the manifest, which lists every file, always first)
    within the report's bound, and how many more there were."""
    wanted = [(k, v) for k, v in sorted(result.artifacts.items())
              if k.startswith("logs/combined") or k.endswith(".xml")]
    room = ARTIFACTS_MAX - 1
    return {"manifest": result.manifest_hash, **dict(wanted[:room])}, max(0, len(wanted) - room)


def parse_run(result: PipelineResult, spec: VerifierSpec, store: ArtifactStore) -> ParseResult:
    inp = ParseInput(artifacts=result.artifacts, store=store,
                     exit_codes=[r.exit_code for r in result.manifest.commands_executed])
    try:
        return get_parser(spec.parser)(inp)
    except Exception as exc:  # hostile input must not crash a run: fail closed instead
        return ParseResult(error=f"parser {spec.parser} crashed: {type(exc).__name__}")


def exit_code_report(result: PipelineResult, *, spec: VerifierSpec, target: Target,
                     why: str) -> VerificationReport:
    """The report of last resort, from exit codes alone, for when the full report could not
    be built: still evidence, still attested. It can FAIL or be INCONCLUSIVE, never PASS
    (the declared evidence was not read)."""
    verdict, reason = decide(result, ParseResult(), "generic")
    if verdict is Result.PASS:
        verdict, reason = Result.INCONCLUSIVE, "every step exited 0, but the report could " \
            "not be built"
    summary = f"{spec.name}: {verdict.value}: {reason}; report could not be built: {why}"
    action = ("Rerun; the report of this run could not be built, so it proves nothing."
              if verdict is Result.INCONCLUSIVE else
              f"Make step '{reason}' succeed; read the cited log lines.")
    combined = {k: v for k, v in result.artifacts.items() if k == "logs/combined.log"}
    return VerificationReport(
        verifier=spec.name[:64], verifier_type=spec.kind.value[:64], target=target,
        result=verdict, summary=shorten(summary, SUMMARY_MAX),
        next_actions=(shorten(action, NEXT_ACTION_MAX),),
        confidence=0.2 if verdict is Result.INCONCLUSIVE else 0.5,
        hyperthesis=("The report builder failed; only exit codes were read.",),
        parser=spec.parser[:32], parser_truncated=True,
        artifacts={**combined, "manifest": result.manifest_hash},
        reporter="deterministic_fallback", log_cut_bytes=_cut_bytes(result),
    )


def _build(result: PipelineResult, spec: VerifierSpec, store: ArtifactStore,
           target: Target, lens: str = "default",
           history: VerifierHistory | None = None) -> VerificationReport:
    parsed = parse_run(result, spec, store)
    verdict, reason = decide(result, parsed, spec.parser, steps=len(spec.steps))
    return deterministic_report(result, spec=spec, target=target, parsed=parsed,
                                verdict=verdict, reason=reason, lens=lens, history=history)


BUILTIN_REPORTERS = ("model",)  # Choir's own async reporters run in the caller's event loop


def _own_thread(word: Any, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
    """Run a plugin reporter (sync or async) in a daemon thread with its own event loop: one
    that blocks (``time.sleep`` in an ``async def``) cannot stall the run's loop, and the
    deadline cuts it off. A thread past its deadline is abandoned, never joined."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(value)

    def body() -> None:
        async def call() -> Any:
            value = word(*args, **kwargs)
            return await value if inspect.isawaitable(value) else value

        try:
            value, error = asyncio.run(call()), None
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting run
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the run's loop is gone: nobody waits any more
            pass

    threading.Thread(target=body, name="choir-reporter", daemon=True).start()
    return future


async def abuild_report(result: PipelineResult, *, spec: VerifierSpec, store: ArtifactStore,
                        target: Target, reporter: str | None = None,
                        reporter_name: str | None = None,
                        deadline_s: float = 30.0, lens: str = "default",
                        history: VerifierHistory | None = None) -> VerificationReport:
    """The report for ``result``, worded by the reporter ``reporter_name`` (a REPORTERS name;
    default: ``model`` when ``reporter`` names a litellm model, else ``deterministic``),
    within the documented bound (``choir.report.bound.fit``).

    Never raises for what a run produced: hostile artifacts or a buggy parser give the
    exit-code report; a reporter that raises, hangs past the deadline, or returns anything
    the rules refuse (``bounded``) gives the deterministic one, saying why. Every run leaves
    a report to attest, and no reporter can raise a result.
    """
    return fit(await _abuild(result, spec=spec, store=store, target=target, reporter=reporter,
                             reporter_name=reporter_name, deadline_s=deadline_s,
                             lens=lens, history=history))


async def _abuild(result: PipelineResult, *, spec: VerifierSpec, store: ArtifactStore,
                  target: Target, reporter: str | None, reporter_name: str | None,
                  deadline_s: float, lens: str = "default",
                  history: VerifierHistory | None = None) -> VerificationReport:
    try:
        report = _build(result, spec, store, target, lens, history)
    except Exception as exc:  # noqa: BLE001 - any fault here must still leave evidence
        return exit_code_report(result, spec=spec, target=target,
                                why=f"{type(exc).__name__}")
    name = reporter_name or ("model" if reporter else "deterministic")
    if name == "deterministic":
        return report
    try:
        word = REPORTERS.get(name)
        # the reporter gets its own copy: one that rewrites the object it was handed (frozen
        # models yield to object.__setattr__) must not rewrite the report it is judged by
        if name == "model" and reporter:
            await llm.ready()  # litellm's import is not the model's time (its deadline)
        kwargs = {"result": result, "store": store, "model": reporter, "deadline_s": deadline_s}
        call = (word(report.model_copy(deep=True), **kwargs) if name in BUILTIN_REPORTERS
                else _own_thread(word, report.model_copy(deep=True), **kwargs))
        worded = await asyncio.wait_for(call, timeout=deadline_s + 2)
        return bounded(report, worded, name, windows(report, result, store))
    except Exception as exc:  # noqa: BLE001 - a reporter words a report; it never removes one
        return fallback(report, f"{type(exc).__name__}: {str(exc)[:200]}")
