"""ATTESTATION (docs/concepts.md): the signed, content-addressed object that alone may promote.

``id`` is the blake3 of the canonical JSON of ``body``; ``signature`` is ed25519 over the same
canonical bytes. Verification recomputes both and every hash the body references.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, SerializerFunctionWrapHandler, StringConstraints, model_serializer

from choir.models._base import Frozen
from choir.models.manifest import AppliedLimits, Interpreter
from choir.models.report import Result, Target

# An attestation names at most this many artifacts, each by a name of at most
# ARTIFACT_NAME_MAX characters, so its size is bounded whatever a step wrote; the run
# manifest (``manifest_hash``) lists every file and is itself hashed and checked.
ARTIFACTS_MAX = 64
ARTIFACT_NAME_MAX = 512


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
    # the only endpoints the steps could reach, through Choir's egress proxy (``hosts:``);
    # absent when empty: ``network`` then says all (true) or nothing (false)
    hosts: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)
    # the host folders bound read-only beside the system's (``sandbox.binds`` and resource
    # folders, resolved; from the stored manifest): what the steps could see and connect
    # to besides the repo; absent when none, so older attestations keep their ids
    binds: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)


class SpecChange(Frozen):
    """How the tree a round verified differs from the spec pinned when the run started.

    Paths are relative to the repo. ``added``: new spec files the work item's
    ``may_change_spec`` allows, verified as extra evidence beside the pinned checks;
    ``ignored``: new spec-matching files it does not allow, never seen by a verifier;
    ``modified``/``deleted``: pinned files the executor changed (verifiers still run the
    pinned versions); ``refused``: the changes that keep this tree from being ASSERTed;
    ``held``: the changes a person approved (``approved``) or must approve first, with
    ``diff`` the artifact hash of their unified diff. ``view_hash`` is the tree hash of what
    the pinned checks run on: the executor's tree with the spec reset to the pin;
    ``additions_view`` the same with the admitted additions beside them (when there are any).
    """

    tree_hash: str
    view_hash: str = ""
    additions_view: str = ""
    added: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    diff: str | None = None
    approved: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.added or self.modified or self.deleted or self.ignored or
                    self.refused or self.held)

    @property
    def blocks(self) -> bool:
        """Whether this change keeps the tree from PASS whatever its verifiers said: a
        refused change, or a held one no person approved."""
        return bool(self.refused) or (bool(self.held) and not self.approved)


def attested_artifacts(files: Mapping[str, str], first: Iterable[str] = ()) -> dict[str, str]:
    """The artifacts an attestation names: ``first`` (those its report lists), then the
    logs, then the rest in path order, at most ``ARTIFACTS_MAX`` with names that fit."""
    order = [*first, *sorted(r for r in files if r.startswith("logs/")), *sorted(files)]
    chosen: dict[str, str] = {}
    for rel in order:
        if len(chosen) == ARTIFACTS_MAX:
            break
        if rel in files and rel not in chosen and len(rel) <= ARTIFACT_NAME_MAX:
            chosen[rel] = files[rel]
    return dict(sorted(chosen.items()))


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
    artifacts: dict[Annotated[str, StringConstraints(max_length=ARTIFACT_NAME_MAX)], str] = Field(
        default_factory=dict, max_length=ARTIFACTS_MAX)
    environment: Environment
    policy_hash: str | None = None
    mood: str | None = None
    lens: str = "default"
    started_at: datetime
    ended_at: datetime
    executor_isolation: Literal["namespace", "none", "tools"] | None = None
    """How the executor that made this tree ran (``choir run``); absent for ``choir verify``.
    ``none`` means its code could have read the signing key: judge the evidence by that."""
    spec_hash: str | None = None
    """The manifest of the spec pinned when the ``choir run`` started (the artifact hash of
    its canonical JSON: every pinned path and its blake3); absent for ``choir verify``."""
    spec_change: SpecChange | None = None
    """How the verified tree's spec differs from the pin, and what the verifiers read."""
    heldout: str | None = None
    """A held-out verifier's run: the blake3 of its files' manifest (files kept outside the
    repo, never shown to the executor, reported back to it as counts only)."""

    @model_serializer(mode="wrap")
    def _omit_absent_executor(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """Absent stays absent, so bodies minted before the field existed keep their ids."""
        data: dict[str, object] = handler(self)
        for key in ("executor_isolation", "spec_hash", "spec_change", "heldout"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class Attestation(Frozen):
    """A signed body. ``signer_key_id`` is the blake3 (first 32 hex) of the raw public key."""

    id: str
    body: AttestationBody
    signer_key_id: str
    public_key: str
    signature: str
