"""An integrity violation found by verification or audit: named, never silent."""

from __future__ import annotations

from choir.models._base import Frozen


class Violation(Frozen):
    """``kind`` e.g. ``artifact_hash``; ``object`` the id or path; what was expected and found."""

    kind: str
    object: str
    expected: str
    found: str
