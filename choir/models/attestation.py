"""ATTESTATION (docs/concepts.md): the signed, content-addressed object that alone may promote.

``id`` is the blake3 of the canonical JSON of ``body``; ``signature`` is ed25519 over the same
canonical bytes. Verification recomputes both and every hash the body references.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from choir.models._base import Frozen
from choir.models.manifest import AppliedLimits, Interpreter
from choir.models.report import Result, Target


class Environment(Frozen):
    """Where the verifier ran, as it actually ran (not as it was asked to)."""

    sandbox: str
    isolation: Literal["container", "namespace", "none"]
    network: bool = False
    image: str | None = None
    image_digest: str | None = None
    os: str = ""
    arch: str = ""
    choir_version: str = ""
    # the resource limits enforced on every step (from the stored manifest); left out of the
    # JSON when absent, so attestations minted before it existed keep their ids
    limits_applied: AppliedLimits | None = Field(default=None, exclude_if=lambda v: v is None)
    # the interpreter the steps ran, with its digest (from the stored manifest); absent as above
    interpreter: Interpreter | None = Field(default=None, exclude_if=lambda v: v is None)


class AttestationBody(Frozen):
    """Everything an attestation vouches for. Hashes are hex blake3."""

    schema_version: Literal[1] = 1
    type: Literal["choir.attestation/v1"] = "choir.attestation/v1"
    run_id: str
    verifier: str
    verifier_kind: str
    verifier_version: str
    verifier_config_hash: str
    commands: tuple[str, ...]
    target: Target
    result: Result
    report_hash: str
    manifest_hash: str
    artifacts: dict[str, str] = Field(default_factory=dict)
    environment: Environment
    policy_hash: str | None = None
    mood: str | None = None
    lens: str = "default"
    started_at: datetime
    ended_at: datetime
    executor_isolation: Literal["namespace", "none", "tools"] | None = None
    """How the executor that made this tree ran (``choir run``); absent for ``choir verify``.
    ``none`` means its code could have read the signing key: judge the evidence by that."""

    @model_serializer(mode="wrap")
    def _omit_absent_executor(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """Absent stays absent, so bodies minted before the field existed keep their ids."""
        data: dict[str, object] = handler(self)
        if data.get("executor_isolation") is None:
            data.pop("executor_isolation", None)
        return data


class Attestation(Frozen):
    """A signed body. ``signer_key_id`` is the blake3 (first 32 hex) of the raw public key."""

    id: str
    body: AttestationBody
    signer_key_id: str
    public_key: str
    signature: str
