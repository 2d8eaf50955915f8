"""Nested verification with other lenses (docs/concepts.md), and what each lens runs.

When a round's evidence is flaky (replicas disagree) or ambiguous (a run was INCONCLUSIVE),
the Director does not guess and does not re-run the executor: it respawns green threads
that look again differently.

- ``clean_rerun``: the same steps in a fresh sandbox. Votes on the verdict.
- ``independent``: another allowlisted verifier named by ``lenses.independent``. Votes as
  itself (a failing independent checker is a failure).
- ``instrumented``: the same steps with ``lenses.instrument_env`` and ``CHOIR_LENS`` set.
  Diagnostic: its report goes to the executor, its result does not vote.
- ``isolated_subset``: only the failing tests (``lenses.isolate`` with ``{tests}``).
  Diagnostic in a nested round (does the failure need the rest of the suite?); the
  verifier itself in the part of a split work item that focuses on those tests.

Every lens run is attested with the commands and environment it really ran with.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from choir.director import conclusive_runs
from choir.models import PlannedVerifier, Result, StepSpec, VerifierSpec

if TYPE_CHECKING:
    from choir.models import VerifierRun

MAX_TESTS = 20
FLAKY_RERUNS = 2


def lens_spec(spec: VerifierSpec, planned: PlannedVerifier) -> VerifierSpec:
    """The spec a planned run actually executes: ``spec`` seen through its lens."""
    if planned.lens == "instrumented":
        env = {**spec.env, **spec.lenses.instrument_env, "CHOIR_LENS": "instrumented"}
        return spec.model_copy(update={"env": env})
    if planned.lens == "isolated_subset" and spec.lenses.isolate and planned.tests:
        tests = " ".join(shlex.quote(t) for t in planned.tests[:MAX_TESTS])
        last = StepSpec(name="isolate", command=spec.lenses.isolate.replace("{tests}", tests))
        env = {**spec.env, "CHOIR_LENS": "isolated_subset"}
        return spec.model_copy(update={"steps": (*spec.steps[:-1], last), "env": env})
    return spec


def failing_tests(runs: Sequence[VerifierRun], verifier: str) -> tuple[str, ...]:
    """Test ids that failed in ``verifier``'s runs, in first-seen order (bounded).

    Test ids come from the log, so from the code under test: one that starts with ``-``
    would be an option to the isolate command (``pytest --version`` exits 0), one that
    starts with ``@`` a file of options pytest reads before parsing any (``@args.txt``
    holding ``--co``: collect only, exit 0, a part ASSERTed: review 17b), and one with
    control characters is nobody's test. All are left out.
    """
    seen: dict[str, None] = {}
    for run in runs:
        if run.verifier == verifier and run.report.result is Result.FAIL:
            for sig in run.report.failure_signatures:
                test = sig.test_id
                if test and not test.startswith(("-", "@")) and test.isprintable():
                    seen.setdefault(test)
    return tuple(seen)[:MAX_TESTS]


def nested_plan(verdicts: Mapping[str, Result], runs: Sequence[VerifierRun],
                specs: Mapping[str, VerifierSpec], need: int = 1) -> list[PlannedVerifier]:
    """The green threads of one nested round, for every verifier not yet conclusive.

    An INCONCLUSIVE verifier gets as many clean reruns as it lacks conclusive runs (``need``
    is the mood's reruns). Replica numbers continue after the runs already made, so each
    nested run has its own run id (and its own sandbox).
    """

    planned: list[PlannedVerifier] = []
    next_replica = {name: 1 + max((r.replica for r in runs if r.verifier == name), default=-1)
                    for name in specs}

    def add(name: str, lens: str, **fields: object) -> None:
        replica = next_replica.get(name, 0)
        next_replica[name] = replica + 1
        planned.append(PlannedVerifier.model_validate(
            {"name": name, "lens": lens, "replica": replica, **fields}))

    for name, result in sorted(verdicts.items()):
        spec = specs.get(name)
        if spec is None or result not in (Result.FLAKY, Result.INCONCLUSIVE):
            continue
        if result is Result.FLAKY:
            for _ in range(FLAKY_RERUNS):
                add(name, "clean_rerun")
            add(name, "instrumented", diagnostic=True)
            tests = failing_tests(runs, name)
            if spec.lenses.isolate and tests:
                add(name, "isolated_subset", tests=tests, diagnostic=True)
        else:
            for _ in range(max(1, need - conclusive_runs(runs, name))):
                add(name, "clean_rerun")
        other = spec.lenses.independent
        if other is not None and other in specs and not any(
                r.verifier == other for r in runs) and not any(p.name == other for p in planned):
            add(other, "independent", checks=name)
    return planned
