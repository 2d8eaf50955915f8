"""Choir's evidence in the standard in-toto predicates, beside Choir's own (``intoto.py``).

Each verifier run's attestation also becomes a test-result statement, and each gate decision
a SLSA verification summary (VSA); ``choir.models.intoto`` holds their shapes and says why.
Both are about the verified tree (the same subject as Choir's statement) and point back to
the Choir attestation they were derived from, so a consumer that knows Choir can check one
against the other, and one that does not can still judge PASSED and FAILED.

A test result is PASSED only for a Choir PASS; FLAKY and INCONCLUSIVE are FAILED, never
WARNED, which some engines accept (Choir is fail-closed: only PASS may promote). The tests
are the verifier's steps (``VERIFIER/STEP``) by exit code, and the failing tests its report
names (``VERIFIER::TEST_ID``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from choir.attest.intoto import sign_statement, statement, tree_subject
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError
from choir.models import Attestation, Result, RunManifest, VerificationReport
from choir.models.intoto import (
    GATE_VERIFIER,
    Descriptor,
    GateVerifier,
    Subject,
    TestResult,
    TestResultStatement,
    VerificationSummary,
    VsaStatement,
)
from choir.trusted.keyfile import SigningKey

PASSED_LEVEL: Final = "CHOIR_ASSERTED"
"""The one level a PASSED VSA claims: the claim is ASSERTed for the tree (no SLSA level)."""
_NAME_MAX = 200
_NAMES_MAX = 256


def attestation_ref(att_id: str) -> Descriptor:
    """How a standard statement names the Choir attestation it stands on."""
    return Descriptor(uri=f"choir:attestation:{att_id}", digest={"blake3": att_id})


def _intact(artifacts: ArtifactStore, digest: str, what: str, att: Attestation) -> bytes:
    if not artifacts.verify(digest):
        raise IntegrityError(f"attestation {att.id}: its {what} ({digest}) is not intact")
    return artifacts.read_bytes(digest)


def _names(names: Iterable[str]) -> tuple[str, ...]:
    kept = [n[:_NAME_MAX] for n in names if n]
    return tuple(dict.fromkeys(kept))[:_NAMES_MAX]


def result_statement(att: Attestation, artifacts: ArtifactStore) -> TestResultStatement:
    """The test-result statement of one verifier run's attestation.

    Raises:
        IntegrityError: its report or run manifest is missing or altered.
    """
    body = att.body
    report = VerificationReport.model_validate_json(
        _intact(artifacts, body.report_hash, "report", att))
    manifest = RunManifest.model_validate_json(
        _intact(artifacts, body.manifest_hash, "run manifest", att))
    steps = [(f"{body.verifier}/{cmd.name}", cmd.exit_code == 0)
             for cmd in manifest.commands_executed]
    tests = [f"{body.verifier}::{sig.test_id}" for sig in report.failure_signatures
             if sig.kind.startswith("test") and sig.test_id]
    # a tree whose change to its pinned checks was refused, or held with no approval, is
    # no PASS whatever the verifier said on the pinned view (``choir verify --base``)
    blocked = body.spec_change is not None and body.spec_change.blocks
    passed = body.result is Result.PASS and not blocked
    configuration = [
        Descriptor(name=f"choir.yaml#verifiers.{body.verifier}"[:_NAME_MAX],
                   digest={"blake3": body.verifier_config_hash}),
        *([Descriptor(name="choir:policy", digest={"blake3": body.policy_hash})]
          if body.policy_hash else []),
        *([Descriptor(name="choir:spec", digest={"blake3": body.spec_hash})]
          if body.spec_hash else []),
        attestation_ref(att.id),
    ]
    return TestResultStatement(
        subject=(Subject.model_validate(tree_subject(body.target)),),
        predicate=TestResult(
            result="PASSED" if passed else "FAILED",
            configuration=tuple(configuration),
            passedTests=_names(name for name, ok in steps if ok),
            failedTests=() if passed else _names([*(n for n, ok in steps if not ok), *tests,
                                                  *(["choir:spec-change"] if blocked else [])]),
        ))


def summary_statement(*, claim: str, tree_hash: str | None, commit_sha: str | None,
                         passed: bool, attestations: Sequence[Attestation], resource_uri: str,
                         now: datetime | None = None) -> VsaStatement:
    """The VSA of one gate decision on ``claim`` for a tree (or a commit alone).

    ``attestations`` are those behind the claim's ASSERT that the gate checked; the policy
    digest is the blake3 of the mood policy they ran under, when they agree on one.
    """
    digest: dict[str, str] = {}
    if tree_hash:
        digest["blake3"] = tree_hash
    same_tree = [a.body.target for a in attestations if a.body.target.tree_hash == tree_hash]
    sha256 = next((t.tree_sha256 for t in same_tree if t.tree_sha256), None)
    commit = commit_sha or next((t.commit_sha for t in same_tree if t.commit_sha), None)
    if tree_hash and sha256:
        digest["sha256"] = sha256
    if commit:
        digest["gitCommit"] = commit
    policies = {a.body.policy_hash for a in attestations}
    policy_hash = policies.pop() if len(policies) == 1 else None
    return VsaStatement(
        subject=(Subject(name=f"tree:{claim}", digest=digest),),
        predicate=VerificationSummary(
            verifier=GateVerifier(id=GATE_VERIFIER),
            timeVerified=(now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            resourceUri=resource_uri,
            policy=Descriptor(uri=GATE_VERIFIER,
                              digest={"blake3": policy_hash} if policy_hash else None),
            inputAttestations=tuple(attestation_ref(a.id) for a in attestations),
            verificationResult="PASSED" if passed else "FAILED",
            verifiedLevels=(PASSED_LEVEL,) if passed else ("FAILED",),
        ))


def bundle(attestations: Iterable[Attestation], signer: SigningKey,
           artifacts: ArtifactStore) -> list[dict[str, Any]]:
    """Two signed envelopes per attestation: Choir's statement, then its test result.

    Raises:
        IntegrityError: evidence an attestation cites is missing or altered.
    """
    out: list[dict[str, Any]] = []
    for att in attestations:
        out.append(sign_statement(statement(att, artifacts), signer))
        out.append(sign_statement(result_statement(att, artifacts), signer))
    return out


def jsonl(envelopes: Iterable[dict[str, Any]]) -> str:
    """The in-toto bundle format: one envelope per line, JSON Lines."""
    return "".join(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n"
                   for e in envelopes)

