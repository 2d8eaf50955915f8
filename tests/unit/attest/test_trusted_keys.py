"""Issue #10 item 7: only pinned key ids are trusted; a swapped key pair is noticed."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from choir.attest import AttestationStore, Signer, load_signer, trusted_key_ids
from choir.attest import keys as keys_mod
from choir.audit import audit
from choir.exceptions import ConfigError, PromotionError
from tests.evidence import attest, make_repo

TRUST_ENV, PIN_FILE = "CHOIR_TRUSTED_KEYS", "trusted_keys"


def trust_root(home: Path) -> keys_mod.TrustRoot:
    return keys_mod.trust_root(home)




@pytest.fixture(autouse=True)
def _no_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRUST_ENV, raising=False)


def _replace_key_pair(home: Path) -> Signer:
    for name in ("ed25519.key", "ed25519.pub"):
        (home / "keys" / name).unlink()
    return load_signer(home)


def test_replacing_the_key_pair_does_not_make_the_new_key_trusted(tmp_path: Path) -> None:
    first = load_signer(tmp_path)
    assert trusted_key_ids(tmp_path) == {first.key_id}
    pin = tmp_path / PIN_FILE
    assert stat.S_IMODE(pin.stat().st_mode) == 0o600 and first.key_id in pin.read_text()
    second = _replace_key_pair(tmp_path)
    assert second.key_id != first.key_id
    assert trusted_key_ids(tmp_path) == {first.key_id}
    [v] = keys_mod.trust_violations(tmp_path)
    assert v.kind == "signer_not_pinned" and v.found == second.key_id


def test_first_use_is_reported_once(tmp_path: Path) -> None:
    assert trust_root(tmp_path).first_use
    again = trust_root(tmp_path)
    assert not again.first_use and again.source == str(tmp_path / PIN_FILE)


def test_the_environment_pin_wins_and_is_exact(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ci, other = Signer.generate(), Signer.generate()
    monkeypatch.setenv(TRUST_ENV, f" {ci.key_id}, {other.key_id} ")
    root = trust_root(tmp_path)
    assert root.keys == {ci.key_id, other.key_id} and root.source == TRUST_ENV
    assert not (tmp_path / PIN_FILE).exists()  # an explicit pin records nothing
    assert load_signer(tmp_path).key_id not in trusted_key_ids(tmp_path)
    assert ci.key_id in root.describe()


@pytest.mark.parametrize("value", ["nothex", "ab" * 40, " , "])
def test_a_malformed_environment_pin_is_a_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(TRUST_ENV, value)
    with pytest.raises(ConfigError, match=TRUST_ENV) as err:
        trust_root(tmp_path)
    assert "fix:" in str(err.value)


def test_a_malformed_pin_file_names_its_line(tmp_path: Path) -> None:
    good = Signer.generate().key_id
    (tmp_path / PIN_FILE).write_text(f"# pinned\n{good}\nnot-a-key\n")
    with pytest.raises(ConfigError) as err:
        trust_root(tmp_path)
    assert f"{tmp_path / PIN_FILE}:3:" in str(err.value)


def test_audit_names_attestations_signed_after_the_key_pair_was_replaced(
        tmp_path: Path, choir_home: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    attest(repo, "unit", "true")
    assert audit().ok  # first key, pinned on first use
    forged_by = _replace_key_pair(choir_home)
    with pytest.raises(PromotionError, match="untrusted_key"):
        attest(repo, "unit", "true")  # the control state refuses to log its outcome...
    forged = next(a for a in AttestationStore() if a.signer_key_id == forged_by.key_id)
    result = audit()  # ...and the audit names the attestation left in the store
    kinds = {(v.kind, v.found) for v in result.violations}
    assert ("attestation_untrusted_key", forged_by.key_id) in kinds
    assert ("signer_not_pinned", forged_by.key_id) in kinds
    assert any(v.object.startswith(forged.id) for v in result.violations)


def test_a_signer_outside_the_pin_is_refused_up_front(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from choir.exceptions import UserError

    mine = load_signer(tmp_path)
    monkeypatch.setenv(TRUST_ENV, Signer.generate().key_id)
    with pytest.raises(UserError, match=f"{mine.key_id} is not among") as err:
        keys_mod.require_pinned_signer(tmp_path)
    assert "fix:" in str(err.value)
    monkeypatch.setenv(TRUST_ENV, mine.key_id)
    assert keys_mod.require_pinned_signer(tmp_path).key_id == mine.key_id
