"""The Director: which allowlisted verifiers run (by mood), and what a round's results mean.

Both halves are pure functions of their inputs, so they are easy to test and replay: ``plan``
never leaves the allowlist, and ``adjudicate`` turns reports into continue / rerun / done /
halt and mood changes (seed 002 §4, §7).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from choir.models import Mood, PlannedVerifier, Result, VerifierPlan
from choir.policy import Policy
from choir.verification import VerifierRun

Action = Literal["done", "retry", "rerun", "halt"]


def plan(policy: Policy, mood: Mood, allowlist: Collection[str], *,
         required: Sequence[str] = (), core_green: bool = False,
         suggestion: Sequence[str] | None = None) -> VerifierPlan:
    """The verifiers for one round: required ones, the mood's, BOLD's broadening once green.

    A model's suggestion may add allowlisted verifiers; anything else it names is dropped
    and recorded, never run.
    """
    mood_policy = policy.moods[mood]
    names = list(dict.fromkeys([*required, *mood_policy.verifiers]))
    if mood is Mood.BOLD and core_green:
        names += [n for n in mood_policy.broaden if n not in names]
    dropped: list[str] = []
    for name in suggestion or ():
        if name in allowlist and name not in names:
            names.append(name)
        elif name not in allowlist:
            dropped.append(name)
    dropped += [n for n in names if n not in allowlist]
    names = [n for n in names if n in allowlist]
    planned = tuple(
        PlannedVerifier(name=n, lens="default" if r == 0 else "clean_rerun", replica=r)
        for n in names for r in range(mood_policy.reruns)
    )
    return VerifierPlan(mood=mood, verifiers=planned, dropped=tuple(dropped),
                        reason=f"{mood.value}: {mood_policy.reruns} run(s) of each",
                        suggested_by="model" if suggestion else "policy")


def verdicts(runs: Sequence[VerifierRun]) -> dict[str, Result]:
    """One result per verifier; replicas that disagree make it FLAKY (seed 002 §7.2)."""
    by_name: dict[str, set[Result]] = {}
    for run in runs:
        by_name.setdefault(run.verifier, set()).add(run.report.result)
    out: dict[str, Result] = {}
    for name, results in by_name.items():
        if len(results) == 1:
            out[name] = next(iter(results))
        elif results <= {Result.PASS, Result.FAIL}:
            out[name] = Result.FLAKY
        else:
            out[name] = Result.FAIL if Result.FAIL in results else Result.INCONCLUSIVE
    return out


def signatures(runs: Sequence[VerifierRun]) -> list[str]:
    return sorted({s.id for r in runs if r.report.result is Result.FAIL
                   for s in r.report.failure_signatures} or
                  {f"{r.verifier}:exit" for r in runs if r.report.result is Result.FAIL})


@dataclass(frozen=True)
class Decision:
    action: Action
    mood: Mood
    reason: str


def adjudicate(runs: Sequence[VerifierRun], *, policy: Policy, mood: Mood, attempt: int,
               max_attempts: int, history: Sequence[Sequence[str]],
               reruns_done: int) -> Decision:
    """What the round's evidence means for the loop. ``history``: earlier rounds' signatures."""
    results = verdicts(runs)
    if results and all(r is Result.PASS for r in results.values()):
        return Decision("done", mood, "every planned verifier passed")
    if any(r is Result.FAIL for r in results.values()):
        current = signatures(runs)
        streak = 1
        for earlier in reversed(history):
            if list(earlier) != current:
                break
            streak += 1
        if streak >= policy.halt_after:
            return Decision("halt", mood, f"the same failure {streak} rounds in a row: "
                            "split the work item or reframe it")
        if attempt >= max_attempts:
            return Decision("halt", mood, f"attempt budget spent ({attempt}/{max_attempts})")
        if streak >= policy.same_signature_limit:
            new = Mood.SKEPTICAL if mood is Mood.CURIOUS else Mood.CURIOUS
            return Decision("retry", new, f"the same failure {streak} rounds in a row: "
                            f"{mood.value} -> {new.value} (reframe, narrow, isolate)")
        return Decision("retry", mood, "verification failed: hypothesis sent to the executor")
    if reruns_done < 1:
        return Decision("rerun", mood, "flaky or inconclusive: nested rerun in clean sandboxes")
    return Decision("halt", mood, "still flaky or inconclusive after a clean rerun: escalate")
