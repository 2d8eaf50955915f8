"""What a callable verifier returns."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from choir.models._base import Frozen

Outcome = Literal["pass", "fail", "inconclusive"]


class VerificationResult(Frozen):
    """A postcondition's outcome. ``inconclusive`` (no evidence either way: a timeout,
    missing data) counts as a failure and never promotes.

    The harness also accepts a dict with the same keys or a bool (True: pass), so a
    verifier file needs nothing from Choir in an interpreter where Choir is not installed.
    """

    outcome: Outcome
    detail: str = Field(default="", max_length=1000)
