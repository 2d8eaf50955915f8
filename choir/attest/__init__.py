"""Attestations: the signed, content-addressed evidence that alone may promote a claim.

``mint`` signs an ``AttestationBody``; ``verify_attestation`` re-derives every hash and
signature and returns named violations; ``AttestationStore`` keeps them write-once;
``to_dsse`` exports an in-toto Statement v1 in a DSSE envelope.
"""

from choir.attest.check import verify_attestation
from choir.attest.intoto import pae, payload_of, statement, to_dsse, verify_dsse
from choir.attest.keys import (
    Signer,
    SigningKey,
    TrustRoot,
    key_id_of,
    load_signer,
    signer_counts,
    trust_root,
    trust_violations,
    trusted_key_ids,
    verify_signature,
)
from choir.attest.mint import mint, signed_bytes
from choir.attest.store import AttestationStore, key_summary

__all__ = [
    "AttestationStore",
    "Signer",
    "SigningKey",
    "TrustRoot",
    "key_id_of",
    "key_summary",
    "load_signer",
    "mint",
    "pae",
    "payload_of",
    "signed_bytes",
    "signer_counts",
    "statement",
    "to_dsse",
    "trust_root",
    "trust_violations",
    "trusted_key_ids",
    "verify_attestation",
    "verify_dsse",
    "verify_signature",
]
