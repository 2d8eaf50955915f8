"""Minting an attestation: the signed, content-addressed object that alone may promote.

The signed bytes are ``canonical_json(body)`` (``choir._core.canonical``: sorted keys, no
white space, UTF-8). ``id`` is the blake3 hex of those bytes and ``signature`` is ed25519
over the very same bytes, so one canonical encoding fixes both: anyone can recompute the id
from the body and check the signature with the public key the attestation carries.
"""

from __future__ import annotations

from choir._core.canonical import blake3_hex, canonical_json
from choir.models import Attestation, AttestationBody
from choir.trusted.keyfile import SigningKey


def signed_bytes(body: AttestationBody) -> bytes:
    """The exact bytes an attestation's id hashes and its signature signs."""
    return canonical_json(body)


def mint(body: AttestationBody, signer: SigningKey) -> Attestation:
    """Sign ``body`` with ``signer``; returns the attestation (not yet stored)."""
    data = signed_bytes(body)
    return Attestation(
        id=blake3_hex(data),
        body=body,
        signer_key_id=signer.key_id,
        public_key=signer.public_key,
        signature=signer.sign(data),
    )
