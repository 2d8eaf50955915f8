"""The standard predicates, judged by in-toto's own tools, not Choir's.

A policy engine that knows in-toto but not Choir reads the bundle with the in-toto attestation
library (the Statement and the predicates' protobufs) and checks the DSSE signature with
securesystemslib and Choir's public key; these tests do exactly that.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf import json_format
from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
from in_toto_attestation.predicates.vsa.v1 import vsa_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from choir.attest import mint, payload_of
from choir.attest.standard import bundle, jsonl, result_statement, summary_statement
from choir.models import FailureSignature, Result, RunManifest
from choir.models.intoto import GATE_VERIFIER, TEST_RESULT_PREDICATE, VSA_PREDICATE
from choir.trusted import signer as broker_signer

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def sslib_key(key_id: str, public_key_b64: str) -> SSlibKey:
    """Choir's public key as securesystemslib knows an ed25519 key."""
    return SSlibKey(key_id, "ed25519", "ed25519",
                    {"public": base64.b64decode(public_key_b64).hex()})


def in_toto_statement(envelope: dict[str, Any]) -> dict[str, Any]:
    """The statement, validated by the in-toto attestation library."""
    stmt = payload_of(envelope)
    pb = json_format.ParseDict(stmt, statement_pb2.Statement())  # unknown fields refused
    Statement.copy_from_pb(pb).validate()
    return stmt


def check_signature(envelope: dict[str, Any], key: SSlibKey) -> None:
    Envelope.from_dict(json.loads(json.dumps(envelope))).verify([key], 1)


def test_the_bundle_is_in_toto_to_in_toto_tools(evidence: Any) -> None:
    signer = broker_signer()  # the broker signs, as every command does
    att = mint(evidence.body, signer)
    envelopes = bundle([att], signer, evidence.store)
    lines = jsonl(envelopes).splitlines()
    assert [json.loads(line) for line in lines] == envelopes
    key = sslib_key(signer.key_id, signer.public_key)
    choir_env, result_env = envelopes
    for env in envelopes:
        check_signature(env, key)
    assert in_toto_statement(choir_env)["predicateType"] == "https://choir.dev/attestation/v1"
    stmt = in_toto_statement(result_env)
    assert stmt["predicateType"] == TEST_RESULT_PREDICATE
    # the predicate is exactly the spec's (the protobuf refuses an unknown field)
    json_format.ParseDict(stmt["predicate"], test_result_pb2.TestResult())
    assert stmt["predicate"]["result"] == "PASSED"
    assert stmt["predicate"]["failedTests"] == []
    # about the very tree Choir's own statement names, pointing back at the attestation
    assert stmt["subject"] == [payload_of(choir_env)["subject"][0]]
    assert {"uri": f"choir:attestation:{att.id}", "digest": {"blake3": att.id}} in \
        stmt["predicate"]["configuration"]


def test_a_wrong_key_or_an_edited_payload_does_not_verify(evidence: Any) -> None:
    signer = broker_signer()
    att = mint(evidence.body, signer)
    _, env = bundle([att], signer, evidence.store)
    from choir.attest import Signer

    other = Signer.generate()
    with pytest.raises(VerificationError):
        check_signature(env, sslib_key(signer.key_id, other.public_key))
    stmt = payload_of(env)
    stmt["predicate"]["result"] = "PASSED" if stmt["predicate"]["result"] == "FAILED" \
        else "FAILED"
    edited = {**env, "payload": base64.b64encode(json.dumps(stmt).encode()).decode()}
    with pytest.raises(VerificationError):
        check_signature(edited, sslib_key(signer.key_id, signer.public_key))


@pytest.mark.parametrize("result", [Result.FAIL, Result.FLAKY, Result.INCONCLUSIVE])
def test_anything_but_pass_is_failed_never_warned(evidence: Any, result: Result,
                                                  report_factory: Any) -> None:
    from choir._core.canonical import canonical_json

    report = report_factory(result).model_copy(update={"failure_signatures": (
        FailureSignature(id="s1", kind="test_failure", test_id="tests.test_calc::test_add"),
        FailureSignature(id="s2", kind="lint", test_id="not-a-test"))})
    manifest = RunManifest.model_validate_json(evidence.store.read_bytes(
        evidence.body.manifest_hash))
    from choir.models import CommandRecord

    failed = manifest.model_copy(update={"commands_executed": (
        CommandRecord(name="install", command="true", exit_code=0, duration_ms=1),
        CommandRecord(name="pytest", command="pytest", exit_code=1, duration_ms=1))})
    body = evidence.body.model_copy(update={
        "result": result, "report_hash": evidence.store.ingest_bytes(canonical_json(report)),
        "manifest_hash": evidence.store.ingest_bytes(canonical_json(failed))})
    signer = broker_signer()
    stmt = result_statement(mint(body, signer), evidence.store)
    predicate = json.loads(stmt.model_dump_json())["predicate"]
    assert predicate["result"] == "FAILED"
    assert predicate["passedTests"] == ["unit/install"]
    assert predicate["failedTests"] == ["unit/pytest", "unit::tests.test_calc::test_add"]
    # and the broker signs it (its checks accept what Choir builds)
    from choir.attest.intoto import sign_statement

    check_signature(sign_statement(stmt, signer), sslib_key(signer.key_id, signer.public_key))


def test_a_missing_report_gets_no_test_result(evidence: Any) -> None:
    from choir.exceptions import IntegrityError

    att = mint(evidence.body, broker_signer())
    evidence.store.path_of(evidence.body.report_hash).unlink()
    with pytest.raises(IntegrityError, match="report"):
        result_statement(att, evidence.store)


def vsa_predicate_by_the_library(predicate: dict[str, Any]) -> None:
    """The VSA predicate through in-toto-attestation's protobuf, which (0.9.x) declares
    ``verifiedLevels`` a string where the SLSA spec says an array (in-toto/attestation#425):
    that one field is held to the spec here, every other by the library."""
    levels = predicate["verifiedLevels"]
    assert isinstance(levels, list) and levels and all(isinstance(v, str) for v in levels)
    rest = {k: v for k, v in predicate.items() if k != "verifiedLevels"}
    json_format.ParseDict(rest, vsa_pb2.VerificationSummary())


@pytest.mark.parametrize("passed", [True, False])
def test_a_gate_decision_is_a_slsa_vsa(evidence: Any, passed: bool) -> None:
    signer = broker_signer()
    att = mint(evidence.body, signer)
    from choir.attest.intoto import sign_statement

    stmt = summary_statement(claim="fix-add", tree_hash=evidence.body.target.tree_hash,
                             commit_sha=None, passed=passed, attestations=[att],
                             resource_uri="git+https://github.com/o/r@refs/pull/1/merge",
                             now=NOW)
    env = sign_statement(stmt, signer)
    check_signature(env, sslib_key(signer.key_id, signer.public_key))
    got = in_toto_statement(env)
    assert got["predicateType"] == VSA_PREDICATE
    predicate = got["predicate"]
    vsa_predicate_by_the_library(predicate)
    assert predicate["verifier"] == {"id": GATE_VERIFIER}
    assert predicate["timeVerified"] == "2026-01-01T00:00:00Z"
    assert predicate["verificationResult"] == ("PASSED" if passed else "FAILED")
    assert predicate["verifiedLevels"] == (["CHOIR_ASSERTED"] if passed else ["FAILED"])
    assert predicate["inputAttestations"] == [{"uri": f"choir:attestation:{att.id}",
                                               "digest": {"blake3": att.id}}]
    assert got["subject"] == [{"name": "tree:fix-add", "digest": {
        "blake3": evidence.body.target.tree_hash, "gitCommit": "a" * 40}}]
