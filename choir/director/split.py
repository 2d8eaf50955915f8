"""Splitting a work item that keeps failing the same way.

Re-running the executor blindly on the same failure wastes the budget. When the failure
divides (two failing verifiers, or several failing tests of a verifier that can run a subset
of its tests), the work item becomes parts, one per failing piece. Each part has the parent's
goal narrowed to its piece, the feedback of its piece only, and a plan of just its verifier
(isolated to its tests where possible). The parts run one after another on the same tree;
when every part is ASSERTed, the parent's full plan verifies the final tree, and only that
can ASSERT the parent. A part that keeps failing the same way may split again ("until
satisfiable"), down to the policy's ``split_depth``; every part at every depth draws on the
one attempt budget of the run (``max_attempts`` of the work item), never a share of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from choir._core.canonical import blake3_hex
from choir.director.lenses import failing_tests
from choir.models import (
    Result,
    VerificationReport,
    VerifierKind,
    VerifierRun,
    VerifierSpec,
    WorkItem,
)

MAX_PARTS = 6
_ID_ROOM = 120


def part_id(parent: str, k: int) -> str:
    """``parent~k``: ``~`` is refused in the ids users write, so a part never shares an id
    (and so an ASSERT that ``choir gate`` would accept) with a user's work item."""
    base = parent if len(parent) <= _ID_ROOM else \
        f"{parent[:_ID_ROOM - 13]}-{blake3_hex(parent.encode())[:12]}"
    return f"{base}~{k}"


def _pieces(runs: Sequence[VerifierRun], failing: Sequence[str],
            specs: Mapping[str, VerifierSpec]) -> list[tuple[str, tuple[str, ...]]]:
    """One piece per failing test where the verifier can isolate tests, else per verifier.

    Past ``MAX_PARTS`` pieces, one per verifier (the parent's final verification checks
    whatever the parts leave out).
    """
    # a held-out verifier's test names never become a part's goal: the executor reads it
    whole = [(name, failing_tests(runs, name)
              if specs[name].lenses.isolate and specs[name].heldout is None else ())
             for name in failing]
    fine: list[tuple[str, tuple[str, ...]]] = []
    for name, tests in whole:
        fine += [(name, (test,)) for test in tests] if len(tests) > 1 else [(name, tests)]
    return fine if len(fine) <= MAX_PARTS else whole[:MAX_PARTS]


def split_parts(item: WorkItem, runs: Sequence[VerifierRun], verdicts: Mapping[str, Result],
                specs: Mapping[str, VerifierSpec], remaining: int) -> list[WorkItem]:
    """The parts of ``item``, or ``[]`` when it does not divide (a single piece) or what is
    left of the budget (``remaining`` executor runs) cannot give each part one attempt.

    The parts draw on what is left of the one budget: each part's ``max_attempts`` is that
    remainder (what it may use at most), and the run's shared count of executor runs stops
    them all at the parent's ceiling, so a split never multiplies the budget.
    """
    if remaining < 1:
        return []
    # a piece is the allowlist's: Choir's own run checks (a trace, ``NAME.mutants``) stay
    # with the whole, which is verified with them (a plan cannot run a part that requires
    # one: review 17e)
    failing = [n for n, r in sorted(verdicts.items())
               if r in (Result.FAIL, Result.FLAKY) and n in specs
               and specs[n].mutates is None and specs[n].kind is not VerifierKind.TRACE]
    pieces = _pieces(runs, failing, specs)
    if len(pieces) < 2 or len(pieces) > remaining:
        return []
    parts = []
    for k, (name, tests) in enumerate(pieces, start=1):
        what = f"{name}" + (f" test {', '.join(t[:160] for t in tests[:3])}" if tests else "")
        if len(tests) > 3:
            what += f" and {len(tests) - 3} more"
        parts.append(item.model_copy(update={
            "id": part_id(item.id, k),
            "max_attempts": remaining,
            "goal": f"{item.goal}\n[part {k}/{len(pieces)} of {item.id}: make {what} pass]",
            "scope": (*item.scope, *tests),
            "required_verifiers": (name,),
            "blast_radius": item.blast_radius,
            "split_of": item.id,
            "focus": tests,
        }))
    return parts


def part_feedback(part: WorkItem, reports: Sequence[VerificationReport]) -> list[
        VerificationReport]:
    """The reports that concern ``part``: its verifier's, narrowed to its focus tests (and
    to the next actions that name no other failing test: those are another part's)."""
    mine = [r for r in reports if r.verifier in part.required_verifiers]
    if not part.focus:
        return mine
    others = {s.test_id for r in mine for s in r.failure_signatures
              if s.test_id and s.test_id not in part.focus}
    return [r.model_copy(update={
        "failure_signatures": tuple(s for s in r.failure_signatures if s.test_id in part.focus),
        "next_actions": tuple(a for a in r.next_actions if not any(t in a for t in others))})
        for r in mine]
