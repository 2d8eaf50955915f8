"""Verification per decision type: which postconditions an action needs (docs/postconditions.md).

``decisions:`` in ``choir.yaml`` maps a decision type to ``verification: {
required_above_blast_radius, methods, verify_timeout_ms}``. A work item (or an Agent run)
names its ``decision_type`` and ``blast_radius``; above the threshold the methods join the
work item's required verifiers, so the AHDB's promotion rules refuse an ASSERT until each of
them has a signed PASS for the same tree (the path every required verifier already takes).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from choir.models._base import Frozen

Threshold = Literal["none", "small", "medium", "large"]
_ORDER = {"none": 0, "small": 1, "medium": 2, "large": 3}


class DecisionVerification(Frozen):
    """``methods`` are allowlisted verifier names (or ``verifiers/NAME.py`` files)."""

    required_above_blast_radius: Threshold = "none"
    methods: tuple[str, ...] = Field(min_length=1)
    verify_timeout_ms: int = Field(default=5000, gt=0, le=3_600_000)
    on_red_drift: Literal["continue", "halt", "degrade"] = "continue"
    degrade_to: Literal["SKEPTICAL", "PARANOID", "CURIOUS"] = "SKEPTICAL"


class Decision(Frozen):
    """One decision type: how an action of that type must be verified."""

    verification: DecisionVerification


def required_methods(decision: Decision, blast_radius: str) -> tuple[str, ...]:
    """The methods an action of ``blast_radius`` must pass: all of them above the threshold
    (``none``: always), none at or below it."""
    rule = decision.verification
    if _ORDER[str(blast_radius)] > _ORDER[rule.required_above_blast_radius]:
        return rule.methods
    return ()
