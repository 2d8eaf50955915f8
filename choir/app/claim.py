"""``choir verify --claim NAME``: a verified tree becomes a claim the gate can answer for.

A CI job verifies a tree and then wants a merge gate for it, but only ``choir run`` work items
reached the AHDB, so ``choir gate`` answered "not ASSERTed" for every verified tree. With a
claim name the session's evidence goes through the same checked AHDB writes as a work item's
round: when every planned verifier PASSed, the claim is proposed, promoted by those PASS
attestations and ASSERTed for exactly the tree (and commit, when the tree is exactly it);
any attested FAIL demotes the claims on that tree it contradicts. An INCONCLUSIVE session
changes nothing. The writes are keyed by the session, so a retry appends nothing twice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from choir._core.paths import choir_home
from choir.ahdb import open_ahdb
from choir.ahdb.store import claim_text
from choir.exceptions import UserError
from choir.graph.begun import run_begun
from choir.models import Result

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a work item id, without parts' ~


def check_claim_name(name: str, *, plan_item: bool = False) -> str:
    """``name`` when it can be a work item id; with a ``.`` only for a plan's own claims
    (``plan_item``: an item's is ``PLAN.ITEM``, ``choir.team.plan.item_key``). A claim a
    person or an agent names (``--claim``, ``choir mcp``'s verify, ``choir ci``) with a dot
    would be that item's: it could ASSERT a tree for the plan under a weaker configuration,
    and the plan would take it as its item's (the driver's round answers from an ASSERT
    already there).

    Raises:
        UserError: it cannot (exit 2, with the rule).
    """
    if not NAME.match(name):
        raise UserError(f"--claim {name!r}: a claim is named like a work item id (letters, "
                        "digits, '.', '_', '-'; up to 128; starting with a letter or digit)\n"
                        "  fix: e.g. --claim my-repo-main")
    if plan_item:
        return name
    if "." in name:
        raise UserError(f"--claim {name!r}: a name with '.' is a plan item's claim "
                        "(PLAN.ITEM), which only `choir plan run` records\n"
                        f"  fix: name it without '.', e.g. --claim {name.replace('.', '-')}")
    if (choir_home() / "plans" / name).exists():
        raise UserError(f"--claim {name!r}: a plan of that name records its integration "
                        "rounds under it, which only `choir plan run` does\n"
                        "  fix: choose another claim name")
    begun = run_begun(name)
    if begun is not None:
        raise UserError(f"--claim {name!r}: a `choir run` work item of that id has "
                        f"begun (run {begun}); its gate answers for its runs (their mood, required "
                        "verifiers and approval), which only `choir run` records\n"
                        f"  fix: use another claim name, e.g. --claim {name}-claim")
    if open_ahdb().run_recorded(name):
        raise UserError(f"--claim {name!r}: a `choir run` work item of that id has rounds "
                        "in the AHDB; its gate answers for its runs (their mood, required "
                        "verifiers and approval), which only `choir run` records\n"
                        "  fix: choose another claim name")
    return name


def record_claim(name: str, *, session: str, mood: str, tree_hash: str,
                 commit_sha: str | None, runs: Sequence[Any],
                 minted: Mapping[str, str], required: Sequence[str] = ()) -> tuple[str | None, str]:
    """Write the session's verdict on claim ``name`` into the AHDB: the ASSERT's id, if any,
    and why not when there is none (for the person: "not ASSERTed" after a PASS needs one).

    ``required``: verifiers the claim needs whatever ran (a plan item's, checked whole): no
    ASSERT without a PASS of each, and each is required by the claim proposed."""
    attested = [r for r in runs if r.run_id in minted and not getattr(r, "diagnostic", False)]
    db = open_ahdb()
    if "." not in name and (run_begun(name) is not None or db.run_recorded(name)):
        # a run began since the name was checked
        return None, f"a `choir run` work item named {name} began meanwhile"
    failing = [minted[r.run_id] for r in attested if r.report.result is Result.FAIL]
    if failing:
        db.demote_failed(name, tree_hash, failing)
        return None, "a verifier FAILed"
    if not runs or len(attested) != len(runs) or any(
            r.report.result is not Result.PASS for r in attested):
        return None, "the session did not PASS"  # inconclusive, flaky or crashed
    missing = set(required) - {r.verifier for r in attested}
    if missing:  # no verifier, no assert
        return None, "no PASS of " + ", ".join(sorted(missing)) + ", which the claim needs"
    asserted = db.is_asserted(name, tree_hash)
    if asserted is not None and {r.verifier for r in attested} | set(required) \
            <= db.verified_by(asserted):
        return asserted.id, ""  # the same evidence again: that ASSERT stands for this one
    disagree = {r.verifier for r in attested} & db.failed_verifiers(name, tree_hash)
    if disagree:  # an attested FAIL on this tree before: the evidence disagrees (FLAKY)
        return None, (f"an attested FAIL of {', '.join(sorted(disagree))} on this very tree is "
                      "on record in this CHOIR_HOME, so this PASS is disagreement (FLAKY), "
                      "which never promotes; a new commit is a new tree")
    claim = db.propose(claim=f"{name}: verified under {mood} by choir verify {session}",
                       work_item=name, tree_hash=tree_hash, commit_sha=commit_sha,
                       required_verifiers=sorted({r.verifier for r in attested} |
                                                 set(required)),
                       key=f"{session}/claim")
    claim = db.promote(claim.id, [minted[r.run_id] for r in attested])
    return db.assert_work_item(name, tree_hash, references=[claim.id],
                               claim=claim_text(name), commit_sha=commit_sha,
                               key=f"{session}/assert").id, ""
