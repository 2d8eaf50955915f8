"""The Director: which allowlisted verifiers run (by mood), and what a round's results mean.

Both halves are pure functions of their inputs, so they are easy to test and replay: ``plan``
never leaves the allowlist, and ``adjudicate`` turns the evidence on one tree into done,
retry, nested (look again with other lenses), split or halt, with mood changes
(docs/concepts.md). The optional model suggestion is asked for elsewhere
(``choir.director.advisor``); here it is only ever a list of names, filtered.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from choir.config.policy import Policy
from choir.exceptions import UserError
from choir.models import (
    Mood,
    PlannedVerifier,
    Result,
    VerifierKind,
    VerifierPlan,
    VerifierSpec,
    WorkItem,
)

if TYPE_CHECKING:
    from choir.models import SpecChange, VerifierRun

Action = Literal["done", "retry", "nested", "broaden", "split", "halt", "escalate"]


def plan(policy: Policy, mood: Mood, allowlist: Collection[str], *,
         required: Sequence[str] = (), suggestion: Sequence[str] | None = None,
         reason: str = "") -> VerifierPlan:
    """The verifiers of a primary round: the required ones and the mood's.

    A model's suggestion may add allowlisted verifiers, never remove one; anything else it
    names is dropped and recorded, never run. (BOLD's broadening is a later round on the
    same tree, once this plan is green: see ``adjudicate``.)
    """
    mood_policy = policy.moods[mood]
    names = list(dict.fromkeys([*required, *mood_policy.verifiers]))
    dropped: list[str] = []
    added = 0
    for name in suggestion or ():
        if name in allowlist and name not in names:
            names.append(name)
            added += 1
        elif name not in allowlist:
            dropped.append(name)
    dropped += [n for n in names if n not in allowlist]
    names = [n for n in names if n in allowlist]
    planned = tuple(
        PlannedVerifier(name=n, lens="default" if r == 0 else "clean_rerun", replica=r)
        for n in names for r in range(mood_policy.reruns)
    )
    why = f"{mood.value}: {mood_policy.reruns} run(s) of each"
    if suggestion is not None:
        why += f"; the director model added {added}, {len(dropped)} dropped"
    return VerifierPlan(mood=mood, verifiers=planned, dropped=tuple(dropped),
                        reason=f"{why}{'; ' + reason if reason else ''}"[:500],
                        suggested_by="model" if suggestion else "policy")


def outside_a_run(chosen: VerifierPlan, specs: Mapping[str, VerifierSpec]) -> VerifierPlan:
    """``chosen`` without ``trace`` verifiers, for a check of a tree outside ``choir run``.

    A trace verifier checks the run's own trace; ``choir verify`` and the llm executor's gate
    have no run to check, and would otherwise run ``choir trace verify`` as a shell step
    (INCONCLUSIVE: no such command in the sandbox). It is dropped and the plan says so.

    Raises:
        UserError: nothing but trace verifiers was planned (no verifier, no assert).
    """
    keep = tuple(p for p in chosen.verifiers if specs[p.name].kind is not VerifierKind.TRACE)
    gone = sorted({p.name for p in chosen.verifiers} - {p.name for p in keep})
    if not gone:
        return chosen
    if not keep:
        raise UserError(f"mood {chosen.mood.value} plans only trace verifiers ({', '.join(gone)})"
                        ", which check a choir run's own trace; add another verifier, or use "
                        "choir run")
    why = f"{chosen.reason}; {', '.join(gone)}: a trace is checked in choir run only"
    return chosen.model_copy(update={"verifiers": keep, "dropped": (*chosen.dropped, *gone),
                                     "reason": why[:500]})


def with_additions(chosen: VerifierPlan, change: SpecChange | None) -> VerifierPlan:
    """Every voting run of ``chosen`` twice when the tree has admitted additions: once on the
    pinned checks alone, once beside the additions (``ADDITIONS_REPLICA``), so an addition can
    add evidence but never make a pinned check pass that fails alone."""
    from choir.evidence.spec import ADDITIONS_REPLICA

    if change is None or not change.added:
        return chosen
    twins = tuple(p.model_copy(update={"replica": p.replica + ADDITIONS_REPLICA})
                  for p in chosen.verifiers if not p.diagnostic)
    return chosen.model_copy(update={"verifiers": (*chosen.verifiers, *twins),
                                     "reason": f"{chosen.reason}; each also beside the "
                                               "admitted new checks"})


def part_plan(item: WorkItem, policy: Policy, mood: Mood,
              specs: Mapping[str, VerifierSpec]) -> VerifierPlan:
    """A split part verifies its own verifiers only, narrowed to its focus tests if it can."""
    reruns = policy.moods[mood].reruns
    planned: list[PlannedVerifier] = []
    for name in item.required_verifiers:
        narrow = bool(item.focus and specs[name].lenses.isolate)
        planned += [PlannedVerifier(name=name, replica=r,
                                    lens="isolated_subset" if narrow else
                                    ("default" if r == 0 else "clean_rerun"),
                                    tests=item.focus if narrow else ())
                    for r in range(reruns)]
    return VerifierPlan(mood=mood, verifiers=tuple(planned),
                        reason=f"part of {item.split_of}: "
                               + ", ".join(item.required_verifiers)
                               + (f" on {len(item.focus)} test(s)" if item.focus else ""))


def verdicts(runs: Sequence[VerifierRun], need: int = 1) -> dict[str, Result]:
    """One result per verifier over all its voting runs on this tree.

    INCONCLUSIVE runs are evidence of nothing, but a verdict needs ``need`` conclusive runs
    (the mood's reruns), so an INCONCLUSIVE replica never lowers the bar. One whose sandbox
    failed or whose thread crashed (``infra``: Choir's side) is ignored once a conclusive run
    exists; one the step made (a tool's crash code, "No module named", no JUnit XML, a cut
    log: what the code under test controls) beside PASSes is a disagreement, FLAKY: a
    failing run dressed as a crash must not let the next run's PASS decide (review 17b).
    Conclusive runs that disagree (or a run that is itself FLAKY) make it FLAKY. Diagnostic
    runs (instrumented, a nested isolated subset) never vote.
    A verifier also run beside admitted new checks (``ADDITIONS_REPLICA``) passes only when
    its pinned checks pass alone and beside them, each by those rules.
    """
    from choir.evidence.spec import ADDITIONS_REPLICA

    by_name: dict[str, list[tuple[int, Result, bool]]] = {}
    for run in runs:
        if not run.diagnostic:
            by_name.setdefault(run.verifier, []).append(
                (run.replica, run.report.result, run.infra))
    out: dict[str, Result] = {}
    for name, voted in by_name.items():
        beside = [(r, infra) for replica, r, infra in voted if replica >= ADDITIONS_REPLICA]
        alone = [(r, infra) for replica, r, infra in voted if replica < ADDITIONS_REPLICA]
        if not beside:
            out[name] = _verdict(alone, need)
            continue
        # a verifier planned beside the work item's admitted new checks passes only if its
        # pinned checks pass alone too: an INCONCLUSIVE alone (the code made to crash
        # without the addition) let the PASS beside it decide (review 17, F5). The two are
        # views of the tree, not replicas of one: judged each on its own, then together
        # (mixed, an INCONCLUSIVE alone beside a PASS read as a disagreement: FLAKY)
        views = (_verdict(alone, need), _verdict(beside, need))
        out[name] = (Result.FLAKY if Result.FLAKY in views else
                     Result.FAIL if Result.FAIL in views else
                     Result.PASS if views == (Result.PASS, Result.PASS) else
                     Result.INCONCLUSIVE)
    return out


def _verdict(results: Sequence[tuple[Result, bool]], need: int) -> Result:
    """``results``: each run's result and whether an INCONCLUSIVE of it is Choir's side."""
    conclusive = [r for r, _ in results if r is not Result.INCONCLUSIVE]
    kinds = set(conclusive)
    made = any(r is Result.INCONCLUSIVE and not infra for r, infra in results)
    if len(kinds) > 1 or Result.FLAKY in kinds or kinds == {Result.PASS} and made:
        return Result.FLAKY
    if not conclusive or (len(conclusive) < need and kinds == {Result.PASS}):
        return Result.INCONCLUSIVE
    return conclusive[0]


def conclusive_runs(runs: Sequence[VerifierRun], name: str) -> int:
    """How many voting runs of ``name`` on this tree were conclusive."""
    return sum(1 for r in runs if r.verifier == name and not r.diagnostic
               and r.report.result is not Result.INCONCLUSIVE)


def signatures(runs: Sequence[VerifierRun]) -> list[str]:
    """The failure signature of a round: what 'the same failure again' is compared by."""
    return sorted({s.id for r in runs if r.report.result is Result.FAIL and not r.diagnostic
                   for s in r.report.failure_signatures} or
                  {f"{r.verifier}:exit" for r in runs
                   if r.report.result is Result.FAIL and not r.diagnostic})


@dataclass(frozen=True)
class Decision:
    action: Action
    mood: Mood
    reason: str


# The mood state machine (docs/concepts.md, "Mood switches"): where the same failure
# ``same_signature_limit`` rounds in a row takes each mood. Every switch climbs ``RANK``, so no
# sequence of rounds can come back to a mood it left (no SKEPTICAL -> CURIOUS -> SKEPTICAL),
# and ``max_mood_switches`` bounds the switches of a run besides. A split narrows to
# SKEPTICAL (or stays PARANOID): that also climbs.
SWITCH: dict[Mood, Mood | None] = {
    Mood.CALM: Mood.CURIOUS, Mood.BOLD: Mood.CURIOUS, Mood.CURIOUS: Mood.SKEPTICAL,
    Mood.SKEPTICAL: None, Mood.PARANOID: None,
}
RANK: dict[Mood, int] = {Mood.CALM: 0, Mood.BOLD: 0, Mood.CURIOUS: 1, Mood.SKEPTICAL: 2,
                         Mood.PARANOID: 3}


def next_mood(mood: Mood) -> Mood:
    """Where the same failure again takes the loop: reframe (CURIOUS), then narrow and
    isolate (SKEPTICAL), which it never leaves; PARANOID is never left either. A switch never
    drops a verifier: plans keep every verifier earlier rounds ran."""
    return SWITCH[mood] or mood


def split_mood(mood: Mood) -> Mood:
    """The mood of a split's parts: narrow and isolate, never a step down."""
    return mood if RANK[mood] >= RANK[Mood.SKEPTICAL] else Mood.SKEPTICAL


def adjudicate(runs: Sequence[VerifierRun], *, policy: Policy, mood: Mood, attempt: int,
               max_attempts: int, history: Sequence[Sequence[str]], nested_done: int,
               can_split: bool = False, broaden: Collection[str] = (),
               contradicted: Collection[str] = (), switches: int = 0) -> Decision:
    """What the evidence on this tree means for the loop.

    ``history`` holds earlier rounds' failure signatures; ``nested_done`` counts the nested
    rounds already spent on this tree; ``can_split`` says whether the work item divides;
    ``broaden`` names the verifiers BOLD still owes this tree once the core is green;
    ``contradicted`` names verifiers with an attested FAIL on this very tree from before (a
    PASS now is disagreement: FLAKY, and no nested round can settle it). A FLAKY verdict
    that nested rounds could not settle is a failure: it never promotes, and the executor is
    told which tests are nondeterministic.

    ``attempt`` and ``max_attempts`` are the run's shared executor budget (every part of a
    split draws on it): once it is spent nothing runs the executor again, so the budget is
    checked before a split is considered. ``switches`` counts the mood switches so far.
    """
    results = verdicts(runs, need=policy.moods[mood].reruns)
    if not results:
        return Decision("halt", mood, "nothing was verified: the plan was empty "
                        "(no verifier, no assert)")
    known_flaky = {n for n in contradicted if results.get(n) is Result.PASS}
    results.update(dict.fromkeys(known_flaky, Result.FLAKY))
    if all(r is Result.PASS for r in results.values()):
        if broaden:
            return Decision("broaden", mood, "the core is green: broadening coverage with "
                            + ", ".join(sorted(broaden)))
        return Decision("done", mood, "every planned verifier passed")
    failed = any(r is Result.FAIL for r in results.values())
    unsettled = [n for n, r in sorted(results.items()) if r in (Result.FLAKY, Result.INCONCLUSIVE)]
    if not failed and nested_done < policy.nested_max and set(unsettled) - known_flaky:
        kinds = sorted({results[n].value.lower() for n in unsettled})
        return Decision("nested", mood, f"{' and '.join(kinds)}: {', '.join(unsettled)}; "
                        f"nested round {nested_done + 1} with other lenses")
    if not failed and all(results[n] is Result.INCONCLUSIVE for n in unsettled):
        return Decision("halt", mood, f"still inconclusive after {nested_done} nested "
                        f"round(s): {', '.join(unsettled)}; escalate to a human")
    if failed:
        what = "verification failed"
    elif known_flaky:
        what = f"flaky: {', '.join(sorted(known_flaky))} failed on this same tree before"
    else:
        what = f"flaky after {nested_done} nested round(s): {', '.join(unsettled)}"
    current = signatures(runs)
    streak = 1
    for earlier in reversed(history):
        if list(earlier) != current:
            break
        streak += 1
    if attempt >= max_attempts:
        return Decision("halt", mood, f"{what}; attempt budget spent ({attempt}/{max_attempts})")
    if streak >= policy.halt_after:
        if can_split:
            return Decision("split", split_mood(mood),
                            f"the same failure {streak} rounds in a row: split into parts "
                            "(narrow and isolate)")
        return Decision("halt", mood, f"the same failure {streak} rounds in a row and the "
                        "work item does not divide further: reframe it or escalate")
    new = next_mood(mood)
    if streak >= policy.same_signature_limit and new is not mood and \
            switches < policy.max_mood_switches:
        return Decision("retry", new, f"the same failure {streak} rounds in a row: "
                        f"{mood.value} -> {new.value} (reframe, narrow, isolate)")
    return Decision("retry", mood, f"{what}: hypothesis sent to the executor")
