"""Export to an in-toto Statement v1 in a DSSE envelope, so supply-chain tools can read it.

Subjects are the verified tree and the evidence objects (report, manifest, artifacts). Each
object carries ``sha256`` (computed streaming from the artifact store) beside ``blake3``:
in-toto consumers ignore digest names they do not know, and most match on sha256. The tree
has no byte stream of its own, so its subject carries the Choir tree hash as ``blake3``, the
sha256 of its canonical manifest (``choir.evidence.tree.tree_manifest``) as ``sha256``
and, only when
the verified tree was exactly that commit's, the commit as ``gitCommit``.

The envelope follows DSSE v1: ``payloadType`` ``application/vnd.in-toto+json``, ``payload``
base64 of the canonical JSON statement, and ``signatures: [{keyid, sig}]`` where ``sig`` is
ed25519 over ``PAE(payloadType, payload)``::

    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body

with LEN the ASCII decimal byte length and SP one space (0x20).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any

from choir._core.canonical import canonical_json
from choir.attest.check import verify_attestation
from choir.attest.keys import TrustRoot, trust_root, verify_signature
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError
from choir.models import Attestation
from choir.models.intoto import CHOIR_PREDICATE, STATEMENT_TYPE
from choir.models.intoto import tree_subject as tree_subject
from choir.trusted.keyfile import SigningKey

PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = CHOIR_PREDICATE


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of ``payload`` (the bytes that get signed)."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _sha256(store: ArtifactStore, digest: str) -> str:
    hasher = hashlib.sha256()
    with store.open(digest) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def statement(att: Attestation, artifacts: ArtifactStore) -> dict[str, Any]:
    """The in-toto Statement v1 for ``att``; the predicate is the whole attestation.

    Raises:
        IntegrityError: an object the attestation references is missing or altered (a
            statement about bytes that are not there would vouch for nothing).
    """
    body = att.body
    subjects: list[dict[str, Any]] = [tree_subject(body.target)]
    objects = {"choir:report": body.report_hash, "choir:manifest": body.manifest_hash}
    objects.update(sorted(body.artifacts.items()))
    for name, digest in objects.items():
        if not artifacts.verify(digest):
            raise IntegrityError(f"attestation {att.id}: object {name} ({digest}) is not intact")
        subjects.append(
            {"name": name, "digest": {"sha256": _sha256(artifacts, digest), "blake3": digest}}
        )
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": json.loads(canonical_json(att)),
    }


def to_dsse(
    att: Attestation, signer: SigningKey, *, artifacts: ArtifactStore | None = None,
    root: TrustRoot | None = None,
) -> dict[str, Any]:
    """A DSSE envelope around the in-toto statement of ``att``, signed by ``signer``.

    The envelope is the signer's word for the attestation, so ``att`` is verified first as
    ``choir gate`` would (id, signature, a pinned and unrevoked key, intact evidence: review
    21, F1): ``AttestationStore.get`` checks only the content hash, and a planted file (FAIL
    flipped to PASS, id recomputed) or one a revoked key signed must not come out re-signed
    by the key consumers trust. ``root`` defaults to this home's ``trust_root``.

    Raises:
        IntegrityError: ``att`` does not verify under ``root`` (each violation named), or see
            ``statement``.
        ConfigError: the pinned or revoked key list is malformed (``trust_root``).
    """
    if artifacts is None:
        artifacts = ArtifactStore()
    if root is None:
        root = trust_root()
    problems = verify_attestation(att, artifacts=artifacts, trusted_keys=root.keys,
                                  revoked_keys=root.revoked)
    if problems:
        raise IntegrityError(
            f"attestation {att.id[:12]} not exported: "
            + "; ".join(f"{v.kind} ({v.object}): expected {v.expected}, found {v.found}"
                        for v in problems)
            + f"\n  ({root.describe()})")
    return sign_statement(statement(att, artifacts), signer)


def sign_statement(stmt: Any, signer: SigningKey) -> dict[str, Any]:
    """A DSSE envelope around the canonical JSON of the in-toto statement ``stmt`` (a dict or
    a model of ``choir.models.intoto``), signed by ``signer``.

    Raises:
        SigningRefused: the broker does not sign statements of this kind or shape.
    """
    payload = canonical_json(stmt)
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode("ascii"),
        "signatures": [{"keyid": signer.key_id, "sig": signer.sign(pae(PAYLOAD_TYPE, payload))}],
    }


def verify_dsse(envelope: Any, public_key: str) -> bool:
    """True when some signature in ``envelope`` is valid for ``public_key``; never raises."""
    try:
        payload_type = envelope["payloadType"]
        payload = base64.b64decode(envelope["payload"], validate=True)
        signatures = envelope["signatures"]
        if not isinstance(payload_type, str) or not isinstance(signatures, list):
            return False
        message = pae(payload_type, payload)
        return any(
            isinstance(entry, dict)
            and isinstance(entry.get("sig"), str)
            and verify_signature(public_key, message, entry["sig"])
            for entry in signatures
        )
    except (KeyError, TypeError, ValueError, binascii.Error):
        return False


def payload_of(envelope: dict[str, Any]) -> dict[str, Any]:
    """The decoded statement inside an envelope (check ``verify_dsse`` first)."""
    result: dict[str, Any] = json.loads(base64.b64decode(envelope["payload"], validate=True))
    return result
