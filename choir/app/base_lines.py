"""The verify contract's ``base`` section as plain lines for a person: whose checks ran (the
base commit's, with ``choir verify --base``) and how the tree changed them. ``choir verify``'s
table, the GitHub step summary and the pre-commit hook print the same lines. The paths are
the tree's, hostile: each value is one plain, bounded line."""

from __future__ import annotations

from typing import Any

from choir._core.terminal import one_line

PATHS_MAX = 50


def base_lines(contract: dict[str, Any]) -> list[str]:
    """The lines, or none when the session had no base."""
    base = contract.get("base")
    if not isinstance(base, dict):
        return []
    lines = [f"checks: the base's, {one_line(base.get('ref'), 80)} = "
             f"{one_line(base.get('commit'), 40)[:12]}"
             + (" (the tree's changes to them approved by a person)" if base.get("approved")
                else "")]
    for name in ("modified", "deleted", "added", "refused"):
        paths = base.get(name) or []
        if isinstance(paths, list) and paths:
            shown = ", ".join(one_line(p, 120) for p in paths[:PATHS_MAX])
            lines.append(f"{name}: {shown}" + (" ..." if len(paths) > PATHS_MAX else ""))
    if base.get("blocked"):
        lines.append(f"not PASS: {one_line(base['blocked'], 600)}")
    return lines
