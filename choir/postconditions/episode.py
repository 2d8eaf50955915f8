"""The ``verification`` field of a sealed run record (an episode, docs/postconditions.md): what each
postcondition said about the action, each entry naming the attestation that proves it.

``choir audit`` re-derives every entry from its signed attestation, so an edited outcome,
severity or a listed verifier without its attestation is a violation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from choir.models import Result
from choir.models._base import Frozen

Outcome = Literal["pass", "fail", "inconclusive"]
Severity = Literal["yellow", "red"]
_OUTCOME: dict[Result, Outcome] = {Result.PASS: "pass", Result.FAIL: "fail",
                                   Result.INCONCLUSIVE: "inconclusive",
                                   Result.FLAKY: "inconclusive"}
_SEVERITY: dict[str, Severity | None] = {"pass": None, "fail": "yellow", "inconclusive": "red"}


class VerificationOutcome(Frozen):
    verifier: str
    run_id: str
    outcome: Outcome
    severity: Severity | None = None
    attestation: str


def outcome_of(verifier: str, run_id: str, result: Result,
               attestation: str) -> VerificationOutcome:
    outcome = _OUTCOME[result]
    return VerificationOutcome(verifier=verifier, run_id=run_id,
                               outcome=outcome,
                               severity=_SEVERITY[outcome], attestation=attestation)


def episode(pairs: Iterable[tuple[Any, Any]]) -> tuple[VerificationOutcome, ...]:
    """``(VerifierRun, Attestation)`` pairs -> the postconditions' outcomes, in plan order."""
    return tuple(outcome_of(run.verifier, run.run_id, att.body.result, att.id)
                 for run, att in pairs if att.body.verifier_kind == "postcondition")


def check_episode(entries: Iterable[VerificationOutcome],
                  bodies: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Audit: each entry against the signed attestation body of its run (run id -> body),
    and every attested postcondition run present."""
    problems: list[tuple[str, str, str]] = []
    seen = set()
    for entry in entries:
        seen.add(entry.run_id)
        body = bodies.get(entry.run_id)
        if body is None or body.verifier_kind != "postcondition":
            problems.append(("episode_unattested", f"a postcondition attestation of "
                                                   f"{entry.run_id}", "none"))
            continue
        want = outcome_of(body.verifier, body.run_id, body.result, entry.attestation)
        if entry != want:
            problems.append(("episode_outcome", want.model_dump_json(),
                             entry.model_dump_json()[:200]))
    for run_id, body in sorted(bodies.items()):
        if body.verifier_kind == "postcondition" and run_id not in seen:
            problems.append(("episode_missing", f"the outcome of {run_id}", "none"))
    return problems
