"""``choir keys rotate`` keeps old evidence valid; a revoked key's attestations and heads are
refused by ``choir gate`` and ``choir audit``, by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.evidence.tree import tree_hash
from tests import forked
from tests.evidence import attest, make_repo


@pytest.fixture(autouse=True)
def _no_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("CHOIR_TRUSTED_KEYS", "CHOIR_REVOKED_KEYS"):
        monkeypatch.delenv(var, raising=False)


def choir(*args: str) -> subprocess.CompletedProcess[str]:
    return forked.run([sys.executable, "-m", "choir", *args], capture_output=True,
                      text=True, timeout=120)


def asserted(repo: Path) -> str:
    db = open_ahdb()
    claim = db.propose(claim="unit passes", work_item="wi", tree_hash=tree_hash(repo),
                       required_verifiers=("unit",))
    att = attest(repo, "unit", "true")
    db.promote(claim.id, [att.id])
    db.assert_work_item("wi", tree_hash(repo), references=[claim.id], claim="done")
    return att.signer_key_id


def audit_kinds() -> tuple[int, set[tuple[str, str]]]:
    proc = choir("audit", "--json")
    return proc.returncode, {(v["kind"], v["found"]) for v in
                             json.loads(proc.stdout)["violations"]}


def test_rotation_keeps_old_evidence_and_revocation_refuses_it_by_name(
        tmp_path: Path, choir_home: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    old = asserted(repo)
    gate = ["gate", "wi", "--repo", str(repo)]
    assert choir(*gate).returncode == 0
    rotated = choir("keys", "rotate")
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.split("new signing key: ")[1].split()[0]
    assert new != old
    assert (choir_home / "keys" / "retired" / f"{old}.pub").exists()
    assert old not in (choir_home / "keys" / "ed25519.key").read_text()
    assert choir(*gate).returncode == 0  # signed by the old key, which is still pinned
    assert audit_kinds() == (0, set())
    assert "signing key: " + new in choir("keys", "show").stdout

    revoked = choir("keys", "revoke", old)
    assert revoked.returncode == 0, revoked.stderr
    answer = choir(*gate)
    # the log's heads were signed by the revoked key, so none of its events counts any more
    # (review 12, F1: the gate answers from events a trusted key signed, and from no other)
    assert answer.returncode == 1 and f"signed by key {old}, which is not trusted" in \
        answer.stdout + answer.stderr, answer.stdout
    code, kinds = audit_kinds()
    assert code == 1
    assert ("attestation_key_revoked", old) in kinds
    assert ("ahdb_head_key_revoked", old) in kinds
    assert "ahdb_unsigned_tail" in {kind for kind, _ in kinds}


def test_rotate_revoke_revokes_the_old_key_and_a_malformed_id_exits_2(
        choir_home: Path) -> None:
    first = choir("keys", "show").stdout.split("signing key: ")[1].split()[0]
    proc = choir("keys", "rotate", "--revoke")
    assert proc.returncode == 0, proc.stderr
    assert first in (choir_home / "revoked_keys").read_text()
    assert f"revoked: {first}" in choir("keys", "show").stdout
    bad = choir("keys", "revoke", "not-a-key")
    assert bad.returncode == 2 and "is not a key id" in bad.stderr


def test_audit_in_a_confined_process_names_a_home_still_signing_with_a_revoked_key(
        choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The confined audit cannot see the key file; it asks the broker which key signs."""
    current = choir("keys", "show").stdout.split("signing key: ")[1].split()[0]
    monkeypatch.setenv("CHOIR_REVOKED_KEYS", current)
    code, kinds = audit_kinds()
    assert code == 1 and any(kind == "signer_revoked" for kind, _ in kinds)


def test_a_revoked_signing_key_is_refused_up_front(choir_home: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from choir.attest import load_signer
    from choir.attest.keys import require_pinned_signer
    from choir.exceptions import UserError

    monkeypatch.setenv("CHOIR_REVOKED_KEYS", load_signer().key_id)
    with pytest.raises(UserError, match="is revoked"):
        require_pinned_signer()
