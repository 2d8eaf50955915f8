"""The standard in-toto statements Choir signs beside its own: their exact shapes.

Policy engines that know in-toto (witness, attestation verifiers, SLSA tooling) cannot read
Choir's predicate, but they know two standard ones, so Choir speaks them too:

- ``https://in-toto.io/attestation/test-result/v0.1`` per verifier run: PASSED, WARNED or
  FAILED, the configuration it ran with, and the tests that passed and failed;
- ``https://slsa.dev/verification_summary/v1`` (a VSA) per gate decision: which verifier
  decided, when, on what attestations and against what policy, and whether it PASSED.

These models are the one definition of both: ``choir.attest.standard`` builds statements
from them, and the signing broker (``choir.trusted.checks``) validates the bytes it is asked
to sign against them, so a statement the broker signs has exactly these fields (extra fields
refused), bounded sizes, and results that agree with themselves (a PASSED test result lists
no failed test; a VSA claims CHOIR_ASSERTED or FAILED, never a SLSA level Choir does not
verify). Field names are the specs' JSON names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

if TYPE_CHECKING:
    from choir.models.report import Target

STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
CHOIR_PREDICATE: Final = "https://choir.dev/attestation/v1"
TEST_RESULT_PREDICATE: Final = "https://in-toto.io/attestation/test-result/v0.1"
VSA_PREDICATE: Final = "https://slsa.dev/verification_summary/v1"
GATE_VERIFIER: Final = "https://choir.dev/gate/v1"
"""``verifier.id`` of every VSA Choir signs: the gate (the signing key names the instance)."""

_TEXT_MAX = 1024
_Text = Annotated[str, StringConstraints(min_length=1, max_length=_TEXT_MAX)]
_Uri = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]{1,1024}$")]
_DigestName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,32}$")]
_DigestValue = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{1,128}$")]
_Digests = Annotated[dict[_DigestName, _DigestValue], Field(min_length=1, max_length=8)]
_Names = Annotated[tuple[_Text, ...], Field(max_length=256)]
# RFC 3339 in UTC, to the second, as ``Timestamp`` JSON in protobuf and the spec's examples
_Time = Annotated[str, StringConstraints(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")]


class _Spec(BaseModel):
    """Frozen, strict, extra fields refused; optional fields absent from the JSON when unset."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True,
                              serialize_by_alias=True)


def _absent(value: object) -> bool:
    return value is None


class Descriptor(_Spec):
    """An in-toto ResourceDescriptor (the fields Choir uses): a name, a URI or digests."""

    name: _Text | None = Field(default=None, exclude_if=_absent)
    uri: _Text | None = Field(default=None, exclude_if=_absent)
    digest: _Digests | None = Field(default=None, exclude_if=_absent)

    @model_validator(mode="after")
    def _names_something(self) -> Descriptor:
        if self.name is None and self.uri is None and self.digest is None:
            raise ValueError("a resource descriptor needs a name, a uri or a digest")
        return self


class Subject(_Spec):
    """What a statement is about: a named object with at least one digest."""

    name: _Text
    digest: _Digests


class TestResult(_Spec):
    """The test-result predicate v0.1 (in-toto/attestation, spec/predicates/test-result.md)."""

    __test__ = False  # a pydantic model, not a pytest class

    result: Literal["PASSED", "WARNED", "FAILED"]
    configuration: Annotated[tuple[Descriptor, ...], Field(max_length=16)] = ()
    url: _Text | None = Field(default=None, exclude_if=_absent)
    passedTests: _Names = ()  # the spec's JSON names
    warnedTests: _Names = ()
    failedTests: _Names = ()

    @model_validator(mode="after")
    def _consistent(self) -> TestResult:
        if self.result == "PASSED" and self.failedTests:
            raise ValueError("a PASSED test result lists no failed test")
        return self


class GateVerifier(_Spec):
    id: Literal["https://choir.dev/gate/v1"]


class VerificationSummary(_Spec):
    """The SLSA verification summary v1 (slsa.dev/spec/v1.0/verification_summary).

    ``verifiedLevels`` is an array, as the spec says; the protobuf of in-toto-attestation
    0.9.x declares it a string (in-toto/attestation#425, fixed by #429).
    """

    verifier: GateVerifier
    timeVerified: _Time
    resourceUri: _Uri
    policy: Descriptor
    inputAttestations: Annotated[tuple[Descriptor, ...], Field(max_length=256)] = ()
    verificationResult: Literal["PASSED", "FAILED"]
    verifiedLevels: tuple[Literal["CHOIR_ASSERTED", "FAILED"]]
    """One level: Choir's gate verifies no SLSA track, so it claims no SLSA level."""

    @model_validator(mode="after")
    def _consistent(self) -> VerificationSummary:
        if (self.verificationResult == "FAILED") != (self.verifiedLevels == ("FAILED",)):
            raise ValueError("verifiedLevels is [FAILED] when, and only when, the "
                             "verification FAILED")
        return self


class _Statement(_Spec):
    type: Literal["https://in-toto.io/Statement/v1"] = Field(default=STATEMENT_TYPE, alias="_type")
    subject: Annotated[tuple[Subject, ...], Field(min_length=1, max_length=64)]


class TestResultStatement(_Statement):
    """An in-toto Statement v1 carrying a test-result predicate."""

    __test__ = False

    predicateType: Literal["https://in-toto.io/attestation/test-result/v0.1"] = (
        TEST_RESULT_PREDICATE)
    predicate: TestResult


class VsaStatement(_Statement):
    """An in-toto Statement v1 carrying a SLSA verification summary."""

    predicateType: Literal["https://slsa.dev/verification_summary/v1"] = (
        VSA_PREDICATE)
    predicate: VerificationSummary


STANDARD_STATEMENTS: dict[str, type[TestResultStatement] | type[VsaStatement]] = {
    TEST_RESULT_PREDICATE: TestResultStatement,
    VSA_PREDICATE: VsaStatement,
}
"""The standard predicate types Choir signs, and the statement model each must validate as."""


def tree_subject(target: Target) -> dict[str, Any]:
    """The subject naming the verified tree: the statement of every predicate is about it."""
    digest: dict[str, str] = {"blake3": target.tree_hash}
    if target.tree_sha256:  # sha256 of the tree's canonical manifest (choir.evidence.tree)
        digest["sha256"] = target.tree_sha256
    if target.commit_sha:  # recorded only when the verified tree was exactly it
        digest["gitCommit"] = target.commit_sha
    return {"name": f"tree:{target.work_item or 'working-tree'}", "digest": digest}
