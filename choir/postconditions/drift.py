"""Drift events: a postcondition that fails or cannot tell is a ``verify`` signal.

FAIL is drift severity yellow (the system answered, and it is not in the state the action
promised); INCONCLUSIVE is red (a timeout, a hang, a crash: nobody knows the state). Each
event goes into the run's events (and so the live view and the sealed run record) and into
the AHDB: HYPOTHESIZE for yellow, HYPERTHESIS for red. A decision type's
``on_red_drift`` turns red drift into a halt or a degrade (a switch to a stricter mood).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Literal

from choir.models import Mood, Result
from choir.models._base import Frozen

if TYPE_CHECKING:
    from choir.ahdb import AHDB
    from choir.director import Decision
    from choir.models.run import VerifierRun
    from choir.postconditions.decisions import Decision as DecisionType

Severity = Literal["yellow", "red"]


class DriftEvent(Frozen):
    """One ``verify`` drift signal, citing the attestation of the run that raised it."""

    signal: Literal["verify"] = "verify"
    severity: Severity
    verifier: str
    run_id: str
    detail: str = ""
    attestation: str | None = None

    def line(self) -> str:
        return f"drift verify {self.severity}: {self.verifier}: {self.detail}"[:500]


def drift_events(runs: Iterable[VerifierRun], minted: Mapping[str, str] | None = None,
                 postconditions: Collection[str] = ()) -> list[DriftEvent]:
    """The drift of a round's postcondition runs (diagnostic runs included: they saw it).

    ``postconditions``: the names of the configured postcondition verifiers: a run of one
    whose green thread crashed has a report of kind ``crashed``, and is red drift too (an
    action that removed its resource's folder made every one crash, and ``on_red_drift:
    halt`` never applied: review 17a)."""
    found = []
    for run in runs:
        report = run.report
        kind = report.verifier_type
        if report.result is Result.PASS or not (
                kind == "postcondition" or kind == "crashed" and run.verifier in postconditions):
            continue
        severity: Severity = "yellow" if report.result is Result.FAIL else "red"
        sig = report.failure_signatures[0].excerpt if report.failure_signatures else ""
        found.append(DriftEvent(severity=severity, verifier=run.verifier, run_id=run.run_id,
                                detail=sig or report.summary[:300],
                                attestation=(minted or {}).get(run.run_id)))
    return found


def record_drift(db: AHDB, events: Iterable[DriftEvent], *, work_item: str, tree_hash: str,
                 key: str) -> None:
    """Write each drift event to the AHDB; keyed, so a replayed node writes nothing twice."""
    for event in events:
        ids = [event.attestation] if event.attestation else []
        if event.severity == "yellow":
            db.hypothesize(work_item, tree_hash, claim=event.line(),
                           discriminating_test=f"rerun postcondition {event.verifier}; it "
                                               "must pass", attestation_ids=ids,
                           key=f"{key}/drift/{event.run_id}")
        else:
            db.hyperthesis(work_item, tree_hash, claim=event.line(), attestation_ids=ids,
                           key=f"{key}/drift/{event.run_id}")


def apply_policy(decision: Decision, events: list[DriftEvent],
                 rule: DecisionType | None) -> Decision:
    """Red drift under ``on_red_drift: halt`` halts; under ``degrade`` the mood switches to
    ``degrade_to``. A done decision is never kept past red drift on a required method:
    INCONCLUSIVE never promotes (the Director already refuses it; this only words it)."""
    from dataclasses import replace

    red = [e for e in events if e.severity == "red"]
    if not red or rule is None:
        return decision
    action = rule.verification.on_red_drift
    names = ", ".join(sorted({e.verifier for e in red}))
    if action == "halt":
        return replace(decision, action="halt",
                       reason=f"red drift on {names}: the policy halts")
    if action == "degrade" and decision.action != "done":
        from choir.director import RANK

        # a switch to a stricter mood only: a PARANOID run is never degraded to SKEPTICAL's
        # one run each, its isolation and its stat-cached tree (review 17b, F3)
        mood = max(decision.mood, Mood(rule.verification.degrade_to), key=RANK.__getitem__)
        return replace(decision, mood=mood,
                       reason=f"{decision.reason}; red drift on {names}: degrade to "
                              f"{mood.value}")
    return decision
