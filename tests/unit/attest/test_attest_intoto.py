"""in-toto Statement v1 in a DSSE envelope, checked against the DSSE spec's own definition."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from choir._core.canonical import blake3_hex, canonical_json
from choir.attest import Signer, mint, pae, payload_of, to_dsse, verify_dsse
from choir.exceptions import IntegrityError


def test_pae_matches_the_spec_vector() -> None:
    # DSSE protocol.md: PAE("http://example.com/HelloWorld", "hello world")
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert pae("", b"") == b"DSSEv1 0  0 "
    assert pae("t\u00e9", b"\x00\xff") == b"DSSEv1 3 t\xc3\xa9 2 \x00\xff"  # byte lengths


def test_envelope_and_statement(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    env = to_dsse(att, evidence.signer, artifacts=evidence.store)
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert env["signatures"][0]["keyid"] == evidence.signer.key_id
    payload = base64.b64decode(env["payload"])
    # the signature is plain ed25519 over PAE(payloadType, payload), checkable without choir
    Ed25519PublicKey.from_public_bytes(base64.b64decode(evidence.signer.public_key)).verify(
        base64.b64decode(env["signatures"][0]["sig"]), pae(env["payloadType"], payload)
    )
    assert verify_dsse(env, evidence.signer.public_key)

    stmt = payload_of(env)
    assert stmt == json.loads(payload)
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["predicateType"] == "https://choir.dev/attestation/v1"
    assert stmt["predicate"] == json.loads(canonical_json(att))
    subjects = {s["name"]: s["digest"] for s in stmt["subject"]}
    assert subjects["tree:fix-add"] == {"blake3": "7" * 64, "gitCommit": "a" * 40}
    for name, digest in {
        "choir:report": att.body.report_hash,
        "choir:manifest": att.body.manifest_hash,
        "logs/combined.log": evidence.log_hash,
    }.items():
        data = evidence.store.read_bytes(digest)
        assert subjects[name] == {"blake3": digest, "sha256": hashlib.sha256(data).hexdigest()}


def test_verify_dsse_rejects_tampering(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    env = to_dsse(att, evidence.signer, artifacts=evidence.store)
    assert not verify_dsse(env, Signer.generate().public_key)
    stmt = payload_of(env)
    stmt["predicate"]["body"]["result"] = "FAIL"
    edited = {**env, "payload": base64.b64encode(canonical_json(stmt)).decode()}
    assert not verify_dsse(edited, evidence.signer.public_key)
    retyped = {**env, "payloadType": "application/json"}
    assert not verify_dsse(retyped, evidence.signer.public_key)
    for junk in (
        None,
        {},
        {"payload": "!!", "payloadType": "x", "signatures": []},
        {**env, "signatures": [{"sig": 5}]},
        {**env, "signatures": "x"},
    ):
        assert not verify_dsse(junk, evidence.signer.public_key)


def test_export_refuses_missing_evidence(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    evidence.store.path_of(evidence.log_hash).unlink()
    with pytest.raises(IntegrityError, match="logs/combined.log"):
        to_dsse(att, evidence.signer, artifacts=evidence.store)


def test_a_dirty_tree_gets_no_git_commit_and_a_sha256_subject(evidence: Any,
                                                               report_factory: Any) -> None:
    from choir.models import Target

    target = Target(work_item="fix-add", tree_hash="7" * 64, tree_sha256="5" * 64)
    report = evidence.store.ingest_bytes(canonical_json(  # the report says the same tree
        report_factory().model_copy(update={"target": target})))
    body = evidence.body.model_copy(update={"target": target, "report_hash": report})
    stmt = payload_of(to_dsse(mint(body, evidence.signer), evidence.signer,
                              artifacts=evidence.store))
    subjects = {s["name"]: s["digest"] for s in stmt["subject"]}
    assert subjects["tree:fix-add"] == {"blake3": "7" * 64, "sha256": "5" * 64}


def test_a_target_without_sha256_hashes_as_before(evidence: Any) -> None:
    """Attestations minted before ``tree_sha256`` existed keep their ids."""
    assert "tree_sha256" not in canonical_json(evidence.body).decode()
    att = mint(evidence.body, evidence.signer)
    from choir.models import Attestation

    again = Attestation.model_validate_json(att.model_dump_json())
    assert mint(again.body, evidence.signer).id == att.id


# -- review 21, F1: the export signs only what verifies ----------------------------------------
def _forged(att: Any) -> Any:
    """``att`` with its result flipped and its id recomputed: what someone who can write
    ``attestations/`` plants; only the signature gives it away."""
    from choir.attest import signed_bytes
    from choir.models import Result

    body = att.body.model_copy(update={"result": Result.FAIL if att.body.result is Result.PASS
                                       else Result.PASS})
    return att.model_copy(update={"body": body, "id": blake3_hex(signed_bytes(body))})


def test_export_refuses_a_planted_attestation(evidence: Any) -> None:
    forged = _forged(mint(evidence.body, evidence.signer))
    with pytest.raises(IntegrityError, match="attestation_signature"):
        to_dsse(forged, evidence.signer, artifacts=evidence.store)


def test_export_refuses_a_revoked_or_unpinned_key(evidence: Any, tmp_path: Any) -> None:
    from choir.attest import trust_root

    att = mint(evidence.body, evidence.signer)
    to_dsse(att, evidence.signer, artifacts=evidence.store)  # pinned on first use: exported
    stranger = mint(evidence.body, Signer.generate())
    with pytest.raises(IntegrityError, match="attestation_untrusted_key"):
        to_dsse(stranger, evidence.signer, artifacts=evidence.store)
    (tmp_path / "home" / "revoked_keys").write_text(f"{att.signer_key_id}\n")
    with pytest.raises(IntegrityError, match="attestation_key_revoked"):
        to_dsse(att, evidence.signer, artifacts=evidence.store)
    with pytest.raises(IntegrityError, match="attestation_key_revoked"):  # a root given, too
        to_dsse(att, evidence.signer, artifacts=evidence.store, root=trust_root())
