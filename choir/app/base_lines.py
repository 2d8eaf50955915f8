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
    if base.get("added") and _undecided_alone(contract):
        # the first tests of a repo (review 17h): no message said why they cannot pass
        lines.append("not PASS: the base's checks decided nothing on this tree (no test of "
                     "theirs ran), and added tests never decide alone (they could be written "
                     "to pass the change they come with); have a person review and merge the "
                     "first tests, or approve them (--approve-spec-change) where the policy "
                     "allows: the gate works from the next change on")
    return lines


def _undecided_alone(contract: dict[str, Any]) -> bool:
    """Whether a verifier passed beside the added checks while its runs of the base's checks
    alone were all INCONCLUSIVE."""
    from choir.evidence.spec import ADDITIONS_REPLICA

    reports, threads = contract.get("reports") or [], contract.get("threads") or []
    runs: dict[str, list[tuple[bool, str]]] = {}
    for report, thread in zip(reports, threads, strict=False):
        if isinstance(report, dict) and isinstance(thread, dict):
            beside = int(thread.get("replica") or 0) >= ADDITIONS_REPLICA
            runs.setdefault(str(report.get("verifier")), []).append(
                (beside, str(report.get("result"))))
    return any(any(b and r == "PASS" for b, r in found) and
               all(r == "INCONCLUSIVE" for b, r in found if not b) and
               any(not b for b, _ in found) for found in runs.values())
