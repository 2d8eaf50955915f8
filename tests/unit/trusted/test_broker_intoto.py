"""The broker signs the standard in-toto predicates Choir builds, and nothing beside them.

Its key must not vouch for what Choir never checked: a SLSA provenance, a VSA in another
verifier's name or claiming a SLSA build level, a test result that passed with failures, or
any field the specs do not define.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from choir._core.canonical import canonical_json
from choir.attest import pae, verify_signature
from choir.exceptions import SigningRefused
from choir.models.intoto import GATE_VERIFIER, TEST_RESULT_PREDICATE, VSA_PREDICATE
from choir.trusted import signer
from choir.trusted.protocol import MAX_SIGNED

SUBJECT = [{"name": "tree:fix-add", "digest": {"blake3": "7" * 64}}]
TEST_RESULT = {
    "_type": "https://in-toto.io/Statement/v1", "subject": SUBJECT,
    "predicateType": TEST_RESULT_PREDICATE,
    "predicate": {"result": "PASSED", "configuration": [{"name": "choir:policy",
                                                         "digest": {"blake3": "c" * 64}}],
                  "passedTests": ["unit/pytest"], "warnedTests": [], "failedTests": []},
}
VSA = {
    "_type": "https://in-toto.io/Statement/v1", "subject": SUBJECT,
    "predicateType": VSA_PREDICATE,
    "predicate": {"verifier": {"id": GATE_VERIFIER}, "timeVerified": "2026-01-01T00:00:00Z",
                  "resourceUri": "git+https://github.com/o/r", "policy": {"uri": GATE_VERIFIER},
                  "inputAttestations": [{"uri": "choir:attestation:" + "a" * 64,
                                         "digest": {"blake3": "a" * 64}}],
                  "verificationResult": "PASSED", "verifiedLevels": ["CHOIR_ASSERTED"]},
}


def dsse(statement: dict[str, Any]) -> bytes:
    return pae("application/vnd.in-toto+json", canonical_json(statement))


def edited(base: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def test_the_standard_statements_choir_builds_are_signed(choir_home: Any) -> None:
    s = signer()
    failed = edited(edited(VSA, ("predicate", "verificationResult"), "FAILED"),
                    ("predicate", "verifiedLevels"), ["FAILED"])
    for statement in (TEST_RESULT, VSA, failed):
        data = dsse(statement)
        assert verify_signature(s.public_key, data, s.sign(data))
    journal = (choir_home / "keys" / "signed.log").read_text()
    assert '"kind":"dsse:test-result"' in journal
    assert '"kind":"dsse:verification_summary"' in journal


PROVENANCE = {"_type": "https://in-toto.io/Statement/v1", "subject": SUBJECT,
              "predicateType": "https://slsa.dev/provenance/v1",
              "predicate": {"buildDefinition": {}, "runDetails": {}}}


@pytest.mark.parametrize("statement, why", [
    (PROVENANCE, "not an in-toto Statement v1 of a predicate Choir signs"),
    (edited(TEST_RESULT, ("_type",), "https://in-toto.io/Statement/v0.1"), "not an in-toto"),
    (edited(TEST_RESULT, ("predicate", "sneaky"), "x"), "not a valid"),
    (edited(TEST_RESULT, ("extra",), 1), "not a valid"),
    (edited(TEST_RESULT, ("predicate", "result"), "PASS"), "not a valid"),
    (edited(TEST_RESULT, ("predicate", "failedTests"), ["unit::t"]), "lists no failed test"),
    (edited(TEST_RESULT, ("subject",), []), "not a valid"),
    (edited(TEST_RESULT, ("subject",), [{"name": "x", "digest": {"sha256": "not hex"}}]),
     "not a valid"),
    (edited(TEST_RESULT, ("predicate", "passedTests"), ["t"] * 300), "not a valid"),
    (edited(TEST_RESULT, ("predicate", "passedTests"), ["x" * 5000]), "not a valid"),
    (edited(TEST_RESULT, ("predicate", "configuration"), [{}]), "a name, a uri or a digest"),
    (edited(VSA, ("predicate", "verifier", "id"), "https://example.com/other-verifier"),
     "not a valid"),
    (edited(VSA, ("predicate", "verifiedLevels"), ["SLSA_BUILD_LEVEL_3"]), "not a valid"),
    (edited(VSA, ("predicate", "verifiedLevels"), ["CHOIR_ASSERTED", "SLSA_BUILD_LEVEL_3"]),
     "not a valid"),
    (edited(VSA, ("predicate", "verifiedLevels"), ["FAILED"]), "when, and only when"),
    (edited(VSA, ("predicate", "verificationResult"), "FAILED"), "when, and only when"),
    (edited(VSA, ("predicate", "timeVerified"), "yesterday"), "not a valid"),
    (edited(VSA, ("predicate", "resourceUri"), "git+https://x\n::add-mask::y"), "not a valid"),
    (edited(VSA, ("predicate", "resourceUri"), "u" * 1025), "not a valid"),
    (edited(VSA, ("predicate", "policy"), KeyError), "not a valid"),
    (edited(VSA, ("predicate", "dependencyLevels"), {"SLSA_BUILD_LEVEL_3": 5}), "not a valid"),
])
def test_the_broker_refuses_every_other_statement(statement: dict[str, Any], why: str) -> None:
    with pytest.raises(SigningRefused, match=why):
        signer().sign(dsse(statement))


def test_a_statement_must_be_canonical_and_bounded() -> None:
    loose = b'{"_type": "https://in-toto.io/Statement/v1"}'
    with pytest.raises(SigningRefused, match="not canonical"):
        signer().sign(pae("application/vnd.in-toto+json", loose))
    huge = edited(TEST_RESULT, ("predicate", "url"), "x" * MAX_SIGNED)
    with pytest.raises(SigningRefused, match="more than"):
        signer().sign(dsse(huge))
    with pytest.raises(SigningRefused, match="one in-toto JSON payload"):
        signer().sign(pae("application/json", canonical_json(TEST_RESULT)))


def test_json_nested_past_the_recursion_limit_is_refused_and_the_broker_lives() -> None:
    """Review 18c: ``json.loads`` raised RecursionError, which no ``except`` took: the broker
    exited, and every later signature of that process failed."""
    deep = b"[" * 100_000 + b"]" * 100_000
    signing = signer()
    with pytest.raises(SigningRefused):
        signing.sign(deep)
    with pytest.raises(SigningRefused):
        signing.sign(pae("application/vnd.in-toto+json", deep))
    with pytest.raises(SigningRefused, match="not canonical"):  # still answering
        signing.sign(pae("application/vnd.in-toto+json",
                         b'{"_type": "https://in-toto.io/Statement/v1"}'))
