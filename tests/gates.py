"""Helpers of the gate tests that need a fresh replay and an honest ASSERT."""

from __future__ import annotations

from pathlib import Path

from choir.ahdb import open_ahdb, signed
from choir.app.gate import check_gate
from choir.evidence.tree import tree_hash
from tests.evidence import attest


def fresh_gate(work_item: str, tree: str) -> tuple[bool, list[str]]:
    """``choir gate``, as a fresh process answers it (no replay remembered from before)."""
    signed._memos.clear()
    answer = check_gate(work_item, tree=tree, commit=None)
    return answer.passed, answer.problems


def asserted(repo: Path, work_item: str) -> None:
    """An honest ASSERT of ``work_item`` on ``repo``'s tree: a PASS of ``unit``."""
    db, tree = open_ahdb(), tree_hash(repo)
    ok = attest(repo, "unit", "true", work_item=work_item)
    claim = db.propose(claim="unit passes", work_item=work_item, tree_hash=tree,
                       required_verifiers=["unit"])
    db.promote(claim.id, [ok.id])
    db.assert_work_item(work_item, tree, references=[claim.id], claim="done")
