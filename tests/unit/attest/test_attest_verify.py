"""Minting and verifying: every forgery and every tampered byte is a named violation."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import blake3
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from choir._core.canonical import canonical_json
from choir.attest import Signer, mint, verify_attestation
from choir.models import Attestation, Result, Target


def kinds(violations: list[Any]) -> set[str]:
    return {v.kind for v in violations}


def flip(path: Path, offset: int) -> None:
    os.chmod(path, 0o644)
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def test_id_and_signature_are_over_canonical_body(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    data = canonical_json(evidence.body)
    assert att.id == blake3.blake3(data).hexdigest()
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(att.public_key))
    public.verify(base64.b64decode(att.signature), data)  # raises if not over these bytes
    assert att.signer_key_id == blake3.blake3(base64.b64decode(att.public_key)).hexdigest()[:32]


def test_sound_attestation_has_no_violations(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    assert verify_attestation(att) == []
    assert (
        verify_attestation(att, artifacts=evidence.store, trusted_keys={evidence.signer.key_id})
        == []
    )
    # JSON round trip (what the store and the CLI do) keeps it valid
    again = Attestation.model_validate_json(canonical_json(att))
    assert verify_attestation(again, artifacts=evidence.store) == []


def test_edited_body_breaks_id_and_signature(evidence: Any) -> None:
    att = mint(evidence.body.model_copy(update={"result": Result.FAIL}), evidence.signer)
    forged = att.model_copy(update={"body": evidence.body})  # claim PASS with FAIL's seal
    assert kinds(verify_attestation(forged)) == {"attestation_id", "attestation_signature"}


def test_forged_signature(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    bad = att.model_copy(update={"signature": base64.b64encode(os.urandom(64)).decode()})
    assert kinds(verify_attestation(bad)) == {"attestation_signature"}
    junk = att.model_copy(update={"signature": "not base64!"})
    assert kinds(verify_attestation(junk)) == {"attestation_signature"}


def test_wrong_key(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    other = Signer.generate()
    swapped = att.model_copy(update={"public_key": other.public_key})
    assert kinds(verify_attestation(swapped)) == {"attestation_key_id", "attestation_signature"}
    relabelled = swapped.model_copy(update={"signer_key_id": other.key_id})
    assert kinds(verify_attestation(relabelled)) == {"attestation_signature"}
    garbage_key = att.model_copy(update={"public_key": "AAAA"})
    assert kinds(verify_attestation(garbage_key)) == {"attestation_signature"}


def test_untrusted_signer(evidence: Any) -> None:
    stranger = mint(evidence.body, Signer.generate())
    assert verify_attestation(stranger) == []  # valid on its own terms...
    found = verify_attestation(stranger, trusted_keys={evidence.signer.key_id})
    assert kinds(found) == {"attestation_untrusted_key"}  # ...but not ours
    # claiming our key id over a stranger's key is caught twice over
    posing = stranger.model_copy(update={"signer_key_id": evidence.signer.key_id})
    found = verify_attestation(posing, trusted_keys={evidence.signer.key_id})
    assert kinds(found) == {"attestation_key_id", "attestation_untrusted_key"}


def test_flipped_byte_in_report_object(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    flip(evidence.store.path_of(evidence.body.report_hash), 20)
    found = verify_attestation(att, artifacts=evidence.store)
    assert kinds(found) == {"object_hash"}
    assert found[0].object.endswith("/report")


def test_flipped_byte_in_manifest_object(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    flip(evidence.store.path_of(evidence.body.manifest_hash), 5)
    assert kinds(verify_attestation(att, artifacts=evidence.store)) == {"object_hash"}


def test_flipped_byte_in_raw_log(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    flip(evidence.store.path_of(evidence.log_hash), 0)
    found = verify_attestation(att, artifacts=evidence.store)
    # the log is both a listed artifact and a file of the signed manifest
    assert kinds(found) == {"object_hash", "manifest_file"}


def test_missing_objects(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    evidence.store.path_of(evidence.body.report_hash).unlink()
    found = verify_attestation(att, artifacts=evidence.store)
    assert kinds(found) == {"object_missing"}
    hostile = mint(  # a key outside the broker: the broker refuses bodies citing absent objects
        evidence.body.model_copy(update={"artifacts": {"x": "../../../etc/passwd"}}),
        Signer.generate(),
    )
    assert "object_missing" in kinds(verify_attestation(hostile, artifacts=evidence.store))


def test_report_must_agree_with_body(evidence: Any, report_factory: Any) -> None:
    failing = evidence.store.ingest_bytes(canonical_json(report_factory(Result.FAIL)))
    att = mint(evidence.body.model_copy(update={"report_hash": failing}), evidence.signer)
    assert kinds(verify_attestation(att, artifacts=evidence.store)) == {"report_result"}
    other_tree = evidence.store.ingest_bytes(canonical_json(report_factory(tree="8" * 64)))
    att2 = mint(evidence.body.model_copy(update={"report_hash": other_tree}), evidence.signer)
    assert kinds(verify_attestation(att2, artifacts=evidence.store)) == {"report_target"}
    not_a_report = evidence.store.ingest_bytes(b'{"hello": "world"}')
    att3 = mint(evidence.body.model_copy(update={"report_hash": not_a_report}), evidence.signer)
    assert kinds(verify_attestation(att3, artifacts=evidence.store)) == {"report_unreadable"}


def test_manifest_must_belong_to_run_and_tree(evidence: Any) -> None:
    other_target = Target(work_item="fix-add", tree_hash="8" * 64, commit_sha="a" * 40)
    body = evidence.body.model_copy(update={"run_id": "run-2", "target": other_target})
    found = verify_attestation(mint(body, evidence.signer), artifacts=evidence.store)
    assert {"manifest_run_id", "manifest_target", "report_target"} <= kinds(found)


def test_hostile_input_never_raises(evidence: Any) -> None:
    for junk in (None, 42, {}, {"id": "x"}, "string", [1, 2]):
        assert kinds(verify_attestation(junk)) == {"attestation_schema"}
    as_dict = mint(evidence.body, evidence.signer).model_dump(mode="json")
    assert verify_attestation(as_dict, artifacts=evidence.store) == []
