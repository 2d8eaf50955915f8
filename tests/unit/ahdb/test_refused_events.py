"""A FAIL the signed log holds but a replay cannot check closes the gate (review 22b, F1).

The gate replays the signed log through the rules; an event they refuse changed nothing and
was dropped silently. A ``demote`` or FAIL ``outcome`` whose attestation can no longer be
checked (its file removed; its report in another ``CHOIR_ARTIFACT_DIR``, as a second CI job
sharing the home leaves it) was dropped, and the demoted claim opened the gate again. Both
reproductions were watched opening the gate on the code before the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.attest import AttestationStore
from choir.evidence.tree import tree_hash
from choir.exceptions import IntegrityError
from choir.trusted import close_all
from tests.evidence import attest, make_repo
from tests.gates import asserted, fresh_gate


def _demoted(repo: Path) -> str:
    """``wi`` ASSERTed, then demoted by a logged FAIL of ``unit`` on its tree; the FAIL's id."""
    asserted(repo, "wi")
    assert fresh_gate("wi", tree_hash(repo))[0]
    fail = attest(repo, "unit", "false", work_item=None)  # outcome logged; demotes
    assert not fresh_gate("wi", tree_hash(repo))[0]
    return fail.id


def _files_only(backend: str) -> None:
    if backend == "postgres":
        pytest.skip("with Postgres the shared index keeps a copy of a removed file")


def _refused_fail(problems: list[str]) -> None:
    found = [p for p in problems if "FAIL's evidence cannot be checked" in p]
    assert found, problems
    assert "event " in found[0] and "CHOIR_ARTIFACT_DIR" in found[0], found


def test_removing_a_fail_attestation_does_not_reopen_the_gate(tmp_path: Path, pinned: str,
                                                              ahdb_backend: str) -> None:
    _files_only(ahdb_backend)
    repo = make_repo(tmp_path / "repo")
    fail = _demoted(repo)
    AttestationStore().path_of(fail).unlink()

    passed, problems = fresh_gate("wi", tree_hash(repo))
    assert not passed, "the FAIL's events were dropped and the demoted claim opened the gate"
    _refused_fail(problems)


def test_a_fail_verified_in_another_artifact_dir_does_not_open_the_gate(
        tmp_path: Path, pinned: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No attacker: a second CI job shares the home, with its own artifact dir."""
    repo = make_repo(tmp_path / "repo")
    asserted(repo, "wi")
    own = Path(str(tmp_path / "choir-home" / "artifacts"))
    close_all()  # the other job's own signing broker, with its own artifact dir
    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(tmp_path / "other-job"))
    attest(repo, "unit", "false", work_item=None)  # logged; demotes
    close_all()
    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(own))

    passed, problems = fresh_gate("wi", tree_hash(repo))
    assert not passed, "a FAIL whose report is in another artifact dir was dropped"
    _refused_fail(problems)


def test_a_refused_pass_side_event_is_still_skipped(
        tmp_path: Path, pinned: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a FAIL-side event fails closed: a PASS that can no longer be checked (its report
    in another job's artifact dir; its stored body still says PASS) can only keep a gate
    shut, so another work item's gate still answers. A removed attestation's result is not
    known, so it fails closed like a FAIL (the first test)."""
    repo = make_repo(tmp_path / "repo")
    asserted(repo, "wi")
    own = Path(str(tmp_path / "choir-home" / "artifacts"))
    close_all()
    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(tmp_path / "other-job"))
    asserted(repo, "other")
    close_all()
    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(own))

    passed, problems = fresh_gate("wi", tree_hash(repo))
    assert passed, problems
    assert not fresh_gate("other", tree_hash(repo))[0]


def test_the_table_rebuild_refuses_a_log_whose_fail_cannot_be_checked(
        tmp_path: Path, choir_home: Path, ahdb_backend: str) -> None:
    """Deriving the tables again (an upgrade) without the FAIL would put the demoted claim
    back: the store refuses to open instead, naming the event and what to do."""
    _files_only(ahdb_backend)
    repo = make_repo(tmp_path / "repo")
    fail = _demoted(repo)
    path = AttestationStore().path_of(fail)
    kept = path.read_bytes()
    path.unlink()
    open_ahdb()._conn().execute("PRAGMA user_version = 1")  # tables to derive again
    with pytest.raises(IntegrityError, match="FAIL's evidence cannot be checked"):
        open_ahdb()
    path.write_bytes(kept)  # the fix the message names: restore the attestation
    assert open_ahdb().is_asserted("wi", tree_hash(repo)) is None
