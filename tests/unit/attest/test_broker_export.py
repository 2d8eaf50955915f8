"""The broker's own check of Choir's in-toto predicate (review 21, F1, the backstop).

``to_dsse`` verifies before it asks for a signature; the broker must not rely on that, since
the main process is what it guards against. Asked directly, it signs a statement of Choir's
predicate only around an attestation its key (or one it retired, unrevoked) really signed,
about exactly the subjects that attestation names.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

from choir._core.canonical import blake3_hex, canonical_json
from choir.attest import Signer, mint, pae, signed_bytes, statement, verify_signature
from choir.exceptions import SigningRefused
from choir.models import Result
from choir.trusted import signer
from choir.trusted.keyfile import rotate_key


def _dsse(stmt: dict[str, Any]) -> bytes:
    return pae("application/vnd.in-toto+json", canonical_json(stmt))


def _sign(stmt: dict[str, Any]) -> str:
    return signer().sign(_dsse(stmt))


def test_a_genuine_attestation_is_signed(evidence: Any) -> None:
    stmt = statement(mint(evidence.body, evidence.signer), evidence.store)
    assert verify_signature(evidence.signer.public_key, _dsse(stmt), _sign(stmt))


def test_a_planted_attestation_is_refused(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    body = att.body.model_copy(update={"result": Result.FAIL})
    forged = att.model_copy(update={"body": body, "id": blake3_hex(signed_bytes(body))})
    with pytest.raises(SigningRefused, match="signature does not hold"):
        _sign(statement(forged, evidence.store))
    relabelled = att.model_copy(update={"signer_key_id": "0" * 32})
    with pytest.raises(SigningRefused, match="key id is not its key's"):
        _sign(statement(relabelled, evidence.store))


def test_another_keys_attestation_is_refused(evidence: Any) -> None:
    stranger = mint(evidence.body, Signer.generate())
    with pytest.raises(SigningRefused, match="neither this broker's key"):
        _sign(statement(stranger, evidence.store))


def test_a_revoked_keys_attestation_is_refused(evidence: Any, tmp_path: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    (tmp_path / "home" / "revoked_keys").write_text(f"{att.signer_key_id}\n")
    with pytest.raises(SigningRefused, match="revoked key"):
        _sign(statement(att, evidence.store))


def test_a_retired_key_counts_until_revoked(evidence: Any, tmp_path: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    rotate_key(tmp_path / "home")
    assert signer().key_id != att.signer_key_id  # a new broker, with the new key
    stmt = statement(att, evidence.store)
    assert verify_signature(signer().public_key, _dsse(stmt), _sign(stmt))
    (tmp_path / "home" / "revoked_keys").write_text(f"{att.signer_key_id}\n")
    with pytest.raises(SigningRefused, match="revoked key"):
        _sign(stmt)
    os.unlink(tmp_path / "home" / "revoked_keys")
    (tmp_path / "home" / "keys" / "retired" / f"{att.signer_key_id}.pub").unlink()
    with pytest.raises(SigningRefused, match="neither this broker's key"):
        _sign(stmt)


@pytest.mark.parametrize("where, value", [
    ((1, "digest", "sha256"), "0" * 64),         # another object's bytes, as consumers match
    ((0, "digest", "blake3"), "8" * 64),         # another tree
    ((1, "name"), "choir:other"),
])
def test_subjects_other_than_the_attestations_are_refused(evidence: Any, where: tuple[Any, ...],
                                                          value: str) -> None:
    stmt = copy.deepcopy(statement(mint(evidence.body, evidence.signer), evidence.store))
    node = stmt["subject"]
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(SigningRefused, match="subjects"):
        _sign(stmt)
    with pytest.raises(SigningRefused, match="subjects"):
        _sign({**stmt, "subject": stmt["subject"][:1]})


def test_a_predicate_with_a_field_added_is_refused(evidence: Any) -> None:
    stmt = statement(mint(evidence.body, evidence.signer), evidence.store)
    with pytest.raises(SigningRefused, match="not an attestation"):
        _sign({**stmt, "predicate": {**stmt["predicate"], "note": "trust me"}})
