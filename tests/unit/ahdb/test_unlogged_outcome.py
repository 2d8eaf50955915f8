"""A FAIL stored but never logged still shuts the gate on its tree (review 22b, F2).

``mint_attestation`` stores the attestation, then logs its outcome: a kill -9 (or a full
disk) between the two left a valid FAIL in the store that the log never saw, so the gate
stayed open on the tree that FAILs, and a later PASS of the same verifier on that tree
promoted (the FLAKY rule reads the log). The kill is the store call with the log skipped.
Both halves were watched opening the gate on the code before the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.ahdb import AHDB, open_ahdb
from choir.attest import AttestationStore
from choir.evidence.tree import tree_hash
from choir.models import Attestation
from tests.evidence import attest, make_repo
from tests.gates import asserted, fresh_gate


def _killed_before_logging(repo: Path, monkeypatch: pytest.MonkeyPatch) -> Attestation:
    """A FAIL of ``unit`` stored; the process killed before its outcome was logged."""
    with monkeypatch.context() as patch:
        patch.setattr(AHDB, "record_outcome", lambda self, att_id: None)
        fail = attest(repo, "unit", "false", work_item=None)
    assert fail.id in set(AttestationStore().ids())
    assert not open_ahdb()._logged("outcome", attestation=fail.id)
    return fail


def test_an_unlogged_fail_shuts_the_gate_on_its_tree(tmp_path: Path, pinned: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo")
    asserted(repo, "wi")
    assert fresh_gate("wi", tree_hash(repo))[0]
    _killed_before_logging(repo, monkeypatch)

    passed, problems = fresh_gate("wi", tree_hash(repo))
    assert not passed, "the gate opened on a tree with a stored, valid, unlogged FAIL"


def test_a_later_pass_on_a_tree_with_an_unlogged_fail_opens_no_gate(
        tmp_path: Path, pinned: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer whose tables never saw the FAIL (one from before the writer looked in the
    store, the way the next test's does) lets the PASS promote; the gate, which answers from
    the signed log and the store, does not open."""
    repo = make_repo(tmp_path / "repo")
    _killed_before_logging(repo, monkeypatch)
    with monkeypatch.context() as patch:
        patch.setattr(AHDB, "_log_unlogged_fails", lambda self: None)
        asserted(repo, "later")

    passed, problems = fresh_gate("later", tree_hash(repo))
    assert not passed, "a PASS after an unlogged FAIL of the same verifier opened the gate"


def test_an_unlogged_pass_or_another_tree_changes_nothing(
        tmp_path: Path, pinned: str, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo")
    asserted(repo, "wi")
    other = make_repo(tmp_path / "other")
    (other / "extra.txt").write_text("another tree\n")
    assert tree_hash(other) != tree_hash(repo)
    _killed_before_logging(other, monkeypatch)
    with monkeypatch.context() as patch:
        patch.setattr(AHDB, "record_outcome", lambda self, att_id: None)
        attest(repo, "unit", "true", work_item=None)

    passed, problems = fresh_gate("wi", tree_hash(repo))
    assert passed, problems


def test_the_writer_logs_an_unlogged_fail_before_it_promotes(
        tmp_path: Path, pinned: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 22's doubt: the writer's own tables let the later PASS promote (only the gate
    looked in the store). A promotion now logs first the stored, valid FAILs whose outcome
    the log lacks, and the rules then refuse it. Old code: the claim was PROMOTED."""
    from choir.exceptions import PromotionError

    repo = make_repo(tmp_path / "repo")
    fail = _killed_before_logging(repo, monkeypatch)
    with pytest.raises(PromotionError, match="attested FAIL on this tree"):
        asserted(repo, "later")
    db = open_ahdb()
    assert db._logged("outcome", attestation=fail.id)
    assert not open_ahdb()._logged("promote")


def test_an_unlogged_pass_is_not_logged_by_a_promotion(
        tmp_path: Path, pinned: str, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo")
    with monkeypatch.context() as patch:
        patch.setattr(AHDB, "record_outcome", lambda self, att_id: None)
        stray = attest(repo, "unit", "true", work_item=None)
    asserted(repo, "wi")
    assert not open_ahdb()._logged("outcome", attestation=stray.id)
