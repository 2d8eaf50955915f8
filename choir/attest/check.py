"""Verifying an attestation: recompute everything, trust nothing, never raise.

Each failed check becomes a named ``Violation`` (its ``kind`` below), so ``choir audit`` can
say exactly what is wrong; an empty list is the only verdict that lets an attestation count.

kinds: ``attestation_schema``, ``attestation_id``, ``attestation_signature``,
``attestation_key_id``, ``attestation_untrusted_key``, ``object_missing``, ``object_hash``,
``report_unreadable``, ``report_result``, ``report_target``, ``manifest_unreadable``,
``manifest_run_id``, ``manifest_target``, ``manifest_file``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from choir._core.canonical import blake3_hex, is_hash
from choir.attest.keys import decode_public_key, key_id_of, key_refusal, verify_signature
from choir.attest.mint import signed_bytes
from choir.models import Attestation, RunManifest, VerificationReport, Violation

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore

# Reports and manifests are bounded; anything bigger is not one of ours.
MAX_DOCUMENT = 4 << 20


def _v(kind: str, obj: str, expected: str, found: str) -> Violation:
    return Violation(kind=kind, object=obj[:200], expected=expected[:200], found=found[:200])


def verify_attestation(
    att: Attestation | Any,
    *,
    artifacts: ArtifactStore | None = None,
    trusted_keys: Collection[str] | None = None,
    revoked_keys: Collection[str] = (),
) -> list[Violation]:
    """Every way ``att`` fails to prove what it claims; empty when it is sound.

    Checks the id against the canonical body, the ed25519 signature against the public key
    the attestation carries, the key id against that key, the key against ``trusted_keys``
    (by key id) when given and against ``revoked_keys`` and, with ``artifacts``, that every
    referenced object exists and re-hashes, that the stored report agrees with the body on
    ``result`` and ``target``, and that the stored manifest belongs to this run and tree and
    its files are intact.
    """
    if not isinstance(att, Attestation):
        try:
            att = Attestation.model_validate(att)
        except (ValidationError, TypeError, ValueError) as err:
            return [_v("attestation_schema", "?", "an Attestation", str(err))]
    found: list[Violation] = []
    data = signed_bytes(att.body)
    actual_id = blake3_hex(data)
    if actual_id != att.id:
        found.append(_v("attestation_id", att.id, actual_id, att.id))
    key_id = att.signer_key_id
    try:
        raw = decode_public_key(att.public_key).public_bytes_raw()
    except ValueError as err:
        found.append(_v("attestation_signature", att.id, "an ed25519 public key", str(err)))
    else:
        key_id = key_id_of(raw)  # trust follows the key that signed, not the label
        if key_id != att.signer_key_id:
            found.append(_v("attestation_key_id", att.id, key_id, att.signer_key_id))
        if not verify_signature(att.public_key, data, att.signature):
            found.append(_v("attestation_signature", att.id, "valid signature", "invalid"))
    refusal = key_refusal(key_id, (key_id,) if trusted_keys is None else trusted_keys,
                          revoked_keys)
    if refusal is not None:
        found.append(_v(f"attestation_{refusal[0]}", att.id, refusal[1], key_id))
    if artifacts is not None:
        found.extend(_check_objects(att, artifacts))
    return found


def _check_objects(att: Attestation, store: ArtifactStore) -> list[Violation]:
    body = att.body
    refs = {"report": body.report_hash, "manifest": body.manifest_hash}
    refs.update({f"artifact:{name}": digest for name, digest in sorted(body.artifacts.items())})
    found: list[Violation] = []
    intact: set[str] = set()
    for role, digest in refs.items():
        where = f"{att.id}/{role}"
        if not isinstance(digest, str) or not is_hash(digest) or not store.exists(digest):
            found.append(_v("object_missing", where, str(digest), "absent"))
        elif not store.verify(digest):
            found.append(_v("object_hash", where, digest, "bytes do not match their hash"))
        else:
            intact.add(role)
    if "report" in intact:
        found.extend(_check_report(att, store))
    if "manifest" in intact:
        found.extend(_check_manifest(att, store))
    return found


def _check_report(att: Attestation, store: ArtifactStore) -> list[Violation]:
    where = f"{att.id}/report"
    try:
        report = VerificationReport.model_validate_json(
            store.read_bytes(att.body.report_hash, limit=MAX_DOCUMENT)
        )
    except (ValidationError, ValueError) as err:
        return [_v("report_unreadable", where, "a VerificationReport", str(err))]
    found = []
    if report.result != att.body.result:
        found.append(_v("report_result", where, att.body.result.value, report.result.value))
    if report.target != att.body.target:
        found.append(
            _v(
                "report_target",
                where,
                att.body.target.model_dump_json(),
                report.target.model_dump_json(),
            )
        )
    return found


def _check_manifest(att: Attestation, store: ArtifactStore) -> list[Violation]:
    where = f"{att.id}/manifest"
    try:
        manifest = RunManifest.model_validate_json(
            store.read_bytes(att.body.manifest_hash, limit=MAX_DOCUMENT)
        )
    except (ValidationError, ValueError) as err:
        return [_v("manifest_unreadable", where, "a RunManifest", str(err))]
    found = []
    if manifest.run_id != att.body.run_id:
        found.append(_v("manifest_run_id", where, att.body.run_id, manifest.run_id))
    if manifest.tree_hash != att.body.target.tree_hash:
        found.append(_v("manifest_target", where, att.body.target.tree_hash, manifest.tree_hash))
    for rel, digest in sorted(manifest.files.items()):
        if not store.verify(digest):
            found.append(_v("manifest_file", f"{where}:{rel}", digest, "missing or altered"))
    return found
