"""HYPOTHESIZE from the evidence: what would make the work item pass, and the experiment
that isolates the failure.

Derived from the round's bounded evidence only: the failing verifiers, their failure
signatures (pasteable test ids, kind, excerpt), the files the attempt changed against the
tree it started from, and the verifier's own ``lenses.isolate`` command with those tests
filled in (exactly what an isolated rerun executes). Every piece of text that came from a
log is clipped; none of it is ever run by Choir from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from choir.director.lenses import FLAKY_RERUNS, failing_tests, lens_spec
from choir.models import PlannedVerifier, Result, VerifierSpec, WorkItem
from choir.models.run import VerifierRun

CLAIM_MAX = 900
TEST_MAX = 600
_FILES_SHOWN = 8


@dataclass(frozen=True)
class Hypothesis:
    """The claim (what fails, where the change is, what would make it pass) and the
    discriminating test (the exact command of the experiment that isolates it)."""

    claim: str
    discriminating_test: str
    verifiers: tuple[str, ...]


def isolate_command(spec: VerifierSpec, tests: Sequence[str]) -> str | None:
    """The exact command the isolated-subset lens runs for ``tests``, or None when the
    verifier cannot isolate tests."""
    if not spec.lenses.isolate or not tests:
        return None
    seen = lens_spec(spec, PlannedVerifier(name=spec.name, lens="isolated_subset",
                                           tests=tuple(tests)))
    return seen.steps[-1].command


def _signatures(runs: Sequence[VerifierRun], name: str) -> list[str]:
    seen: dict[str, None] = {}
    for run in runs:
        if run.verifier != name or run.diagnostic or run.report.result is not Result.FAIL:
            continue
        for sig in run.report.failure_signatures:
            excerpt = " ".join(sig.excerpt.split())[:100]
            seen.setdefault(f"{sig.test_id or sig.kind} ({sig.kind}"
                            + (f": {excerpt})" if excerpt else ")"))
    return list(seen)[:3]


def derive(item: WorkItem, runs: Sequence[VerifierRun], results: Mapping[str, Result],
           specs: Mapping[str, VerifierSpec], changed: Sequence[str] | None,
           since: str = "the commit the tree sits on") -> Hypothesis | None:
    """The hypothesis of a failing round, or None when nothing failed. ``changed`` is None
    when it is unknown which files the attempt changed (no git history to compare with)."""
    failing = [n for n, r in sorted(results.items()) if r in (Result.FAIL, Result.FLAKY)]
    if not failing:
        return None
    what: list[str] = []
    experiments: list[str] = []
    for name in failing:
        spec = specs.get(name)
        tests = failing_tests(runs, name)
        full = " && ".join(s.command for s in spec.steps) if spec else name
        if results[name] is Result.FLAKY:
            what.append(f"{name} is nondeterministic on this tree (its runs disagree)")
            experiments.append(f"rerun {name} in clean sandboxes: it must pass every time "
                               f"({FLAKY_RERUNS} clean reruns of `{full}` that agree)")
            continue
        sigs = _signatures(runs, name)
        what.append(f"{name} fails " + ("; ".join(sigs) if sigs else "a step (no test named)"))
        isolated = isolate_command(spec, tests) if spec else None
        named = f" (failing: {', '.join(t[:120] for t in tests[:3])})" if tests else ""
        experiments.append(f"{name}: `{isolated}` fails now and must pass" if isolated else
                           f"{name}: `{full}` exits non-zero now{named} and must exit 0")
    changed = list(changed) if changed is not None else None
    files = ", ".join((changed or [])[:_FILES_SHOWN]) + (
        f" and {len(changed) - _FILES_SHOWN} more" if changed and len(changed) > _FILES_SHOWN
        else "")
    where = ("which files the attempt changed is unknown (no git history to compare with)"
             if changed is None else f"the attempt changed {files} against {since}" if changed
             else f"the attempt changed no file against {since}: the failure predates the change")
    names = [n for n in failing if results[n] is Result.FAIL]
    need = (f"it passes when {', '.join(names)} pass" + (" with the change confined to those "
            "files" if changed else "") if names else "it passes when the runs agree on PASS")
    claim = f"{'; '.join(what)}; {where}; {need} ({item.goal[:200]})"
    return Hypothesis(claim=claim[:CLAIM_MAX], discriminating_test="; ".join(experiments)[
        :TEST_MAX], verifiers=tuple(failing))
