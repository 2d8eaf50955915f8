"""What the broker checks before it signs: the bytes are a Choir object it recognises.

The broker decides by content, never by what the client says the bytes are, so a request
cannot dodge the checks of one kind by claiming another. Every accepted byte string is:

- bounded: at most ``MAX_SIGNED`` bytes;
- well-formed: canonical JSON of one object (``choir._core.canonical``: re-encoding the
  parsed object gives the very same bytes), or a DSSE pre-authentication encoding;
- typed, by its ``type`` field:
  - ``choir.attestation/v1``: validates as ``AttestationBody`` (frozen, extra fields
    refused), and the report and run manifest it cites exist in the artifact store and
    re-hash to their names (opened without following the last link; read, never parsed);
  - ``choir.ahdb-head/v1``: exactly ``type``, ``seq`` (a positive integer) and ``head`` (a
    blake3 hex digest);
  - any other ``choir.*`` type: a record (trace or session records sign their own
    canonical bodies); its type keeps its signature from passing for a head's or an
    attestation's, whose verifiers rebuild the bytes with their own type;
  - DSSE: payload type ``application/vnd.in-toto+json`` and a canonical in-toto
    Statement v1 whose predicate type is Choir's (an attestation whose signature holds
    under this broker's key or one it retired, unrevoked, about exactly the subjects its
    body names, their bytes re-hashed here), or one of the standard predicates Choir
    speaks beside it (in-toto test-result v0.1, SLSA verification summary v1), which must
    then validate as its model in ``choir.models.intoto``: exactly the spec's fields, bounded,
    self-consistent, and a VSA only in the name of Choir's gate. No other predicate type is
    signed, so the key cannot vouch for a build provenance or anything Choir never checked.

What the broker cannot check is whether a well-formed body is true (that the tests really
passed): that would mean parsing logs and walking trees, the hostile bytes the separation
keeps out of this process. ``docs/security.md`` says what that leaves an attacker.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError

from choir._core import fsopen
from choir._core.canonical import blake3_hex, canonical_json, is_hash
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError, SigningRefused
from choir.models import Attestation, AttestationBody
from choir.models.intoto import CHOIR_PREDICATE, STANDARD_STATEMENTS, STATEMENT_TYPE
from choir.trusted.keyfile import RETIRED_DIR, held_key, key_id_of
from choir.trusted.protocol import MAX_SIGNED

ATTESTATION_TYPE = "choir.attestation/v1"
HEAD_TYPE = "choir.ahdb-head/v1"
DSSE_PAYLOAD_TYPE = b"application/vnd.in-toto+json"
_DSSE_KINDS = {CHOIR_PREDICATE: "dsse", **{t: f"dsse:{t.split('/')[-2]}"
                                           for t in STANDARD_STATEMENTS}}
_RECORD_TYPE_MAX = 100


def _canonical_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise SigningRefused(f"{what} is not JSON (or nested too deep)") from None
    if not isinstance(obj, dict):
        raise SigningRefused(f"{what} is not a JSON object")
    if canonical_json(obj) != data:
        raise SigningRefused(f"{what} is not canonical JSON (sorted keys, no white space)")
    return obj


def _check_head(obj: dict[str, Any]) -> None:
    seq, head = obj.get("seq"), obj.get("head")
    if set(obj) != {"type", "seq", "head"} or type(seq) is not int or not 0 < seq < 1 << 62 \
            or not isinstance(head, str) or not is_hash(head):
        raise SigningRefused("a head is exactly a type, a positive seq and a blake3 head")


def _check_attestation(obj: dict[str, Any], data: bytes,
                       store: Callable[[], ArtifactStore]) -> None:
    try:
        body = AttestationBody.model_validate(obj)
    except ValidationError as err:
        raise SigningRefused(f"not a valid attestation body: {err}"[:1500]) from None
    if canonical_json(body) != data:
        raise SigningRefused("the attestation body does not re-encode to the bytes sent")
    for role, digest in (("report", body.report_hash), ("manifest", body.manifest_hash)):
        if not store().verify(digest):
            raise SigningRefused(f"the attestation's {role} {digest[:80]} is not in the "
                                 "artifact store with that hash")


def _check_dsse(data: bytes, store: Callable[[], ArtifactStore]) -> str:
    parts = data.split(b" ", 4)
    if len(parts) != 5 or parts[2] != DSSE_PAYLOAD_TYPE or \
            parts[1] != str(len(parts[2])).encode() or parts[3] != str(len(parts[4])).encode():
        raise SigningRefused("a DSSE envelope must carry one in-toto JSON payload")
    statement = _canonical_object(parts[4], "the DSSE payload")
    kind = statement.get("predicateType")
    if statement.get("_type") != STATEMENT_TYPE or not isinstance(kind, str) or \
            kind not in _DSSE_KINDS:
        raise SigningRefused("the DSSE payload is not an in-toto Statement v1 of a predicate "
                             "Choir signs (its own, test-result v0.1, SLSA VSA v1)")
    if kind == CHOIR_PREDICATE:
        _check_choir_statement(statement, store)
    model = STANDARD_STATEMENTS.get(kind)
    if model is not None:
        try:
            model.model_validate_json(parts[4])
        except ValidationError as err:
            raise SigningRefused(f"not a valid {kind} statement: {err}"[:1500]) from None
    return _DSSE_KINDS[kind]


def _check_choir_statement(statement: dict[str, Any],
                           store: Callable[[], ArtifactStore]) -> None:
    """Choir's own predicate is a whole attestation, re-signed for in-toto tools: this key
    vouches for it only when it is one this broker's key made, now or before a rotation
    (``keys/retired``), and the key is not revoked; its subjects are the ones its body
    names. A planted attestation (FAIL made PASS, id recomputed) or one a revoked key
    signed is refused, whatever the main process checked first (review 21, F1)."""
    held = held_key()
    if held is None:
        raise SigningRefused("this broker holds no key to check the attestation against")
    home, keys, own = held
    predicate = statement.get("predicate")
    try:
        att = Attestation.model_validate(predicate)
    except ValidationError as err:
        raise SigningRefused(f"the predicate is not an attestation: {err}"[:1500]) from None
    if canonical_json(att) != canonical_json(predicate):
        raise SigningRefused("the predicate does not re-encode as the attestation it holds")
    data = canonical_json(att.body)
    if blake3_hex(data) != att.id:
        raise SigningRefused(f"attestation {att.id[:80]} does not match its body")
    key_id = _signer_id(att.public_key, data, att.signature)
    if key_id != att.signer_key_id:
        raise SigningRefused(f"attestation {att.id[:16]}: its key id is not its key's")
    if att.public_key != own and _retired(keys, key_id) != att.public_key:
        raise SigningRefused(f"attestation {att.id[:16]} was signed by key {key_id}, which "
                             "is neither this broker's key nor one it retired")
    from choir.exceptions import ConfigError
    from choir.trusted.keylists import revoked_key_ids

    try:
        revoked = revoked_key_ids(home)
    except ConfigError as err:
        raise SigningRefused(f"the revoked key list is unreadable: {err}"[:1500]) from None
    if key_id in revoked:
        raise SigningRefused(f"attestation {att.id[:16]} was signed by revoked key {key_id}")
    if statement.get("subject") != _subjects(att, store):
        raise SigningRefused("the statement's subjects are not the ones its attestation "
                             "names (its tree and evidence objects)")


def _signer_id(public_key: str, data: bytes, signature: str) -> str:
    """The id of ``public_key`` when ``signature`` over ``data`` holds under it."""
    try:
        raw = base64.b64decode(public_key.encode("ascii"), validate=True)
        Ed25519PublicKey.from_public_bytes(raw).verify(
            base64.b64decode(signature.encode("ascii"), validate=True), data)
    except (ValueError, UnicodeEncodeError, binascii.Error, InvalidSignature):
        raise SigningRefused("the attestation's signature does not hold under its key"
                             ) from None
    return key_id_of(raw)


def _retired(keys: Path | int, key_id: str) -> str | None:
    """The public key retired as ``key_id`` in the key folder ``keys`` (``rotate_key``;
    the broker's pinned descriptor), read bounded and never through a link or a FIFO; None
    when there is none."""
    try:
        text = fsopen.read_bytes(keys, f"{RETIRED_DIR}/{key_id}.pub", 128)
    except OSError:
        return None
    return text.decode("ascii", "replace").strip()


def _subjects(att: Attestation, store: Callable[[], ArtifactStore]) -> list[dict[str, Any]]:
    """The subjects ``choir.attest.intoto.statement`` gives ``att``: its tree, and each
    object it names with both digests, hashed here (consumers match on sha256, so a statement
    pairing a genuine attestation with other bytes' digests is refused too)."""
    from choir.models.intoto import tree_subject

    body = att.body
    objects = {"choir:report": body.report_hash, "choir:manifest": body.manifest_hash}
    objects.update(sorted(body.artifacts.items()))
    subjects = [tree_subject(body.target)]
    for name, digest in objects.items():
        b3, sha = blake3.blake3(), hashlib.sha256()
        try:
            with store().open(digest) as fh:
                while chunk := fh.read(1 << 20):
                    b3.update(chunk)
                    sha.update(chunk)
        except IntegrityError as err:
            raise SigningRefused(f"the attestation's {name}: {err}"[:500]) from None
        if b3.hexdigest() != digest:
            raise SigningRefused(f"the attestation's {name} {digest[:80]} is altered")
        subjects.append({"name": name, "digest": {"blake3": digest, "sha256": sha.hexdigest()}})
    return subjects


def classify(data: bytes, store: Callable[[], ArtifactStore]) -> str:
    """The kind of Choir object ``data`` is, after its checks (see the module docstring).

    ``store`` gives the artifact store, opened only when an attestation body needs it.

    Raises:
        SigningRefused: ``data`` is oversized, malformed, or not a Choir object.
    """
    if len(data) > MAX_SIGNED:
        raise SigningRefused(f"{len(data)} bytes is more than the {MAX_SIGNED} the broker signs")
    if data.startswith(b"DSSEv1 "):
        return _check_dsse(data, store)
    obj = _canonical_object(data, "the signed bytes")
    kind = obj.get("type")
    if kind == HEAD_TYPE:
        _check_head(obj)
        return "head"
    if kind == ATTESTATION_TYPE:
        _check_attestation(obj, data, store)
        return "attestation"
    if not isinstance(kind, str) or not kind.startswith("choir.") or \
            len(kind) > _RECORD_TYPE_MAX:
        raise SigningRefused("the signed bytes are not a Choir object (no choir.* type)")
    return "record"  # its type keeps it apart: a verifier of heads or attestations checks it
