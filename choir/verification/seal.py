"""Record seals: a record Choir keeps beside its evidence becomes evidence once it is signed.

A run's trace and a ``choir verify`` session's manifest are files in ``CHOIR_HOME``; anyone
who can write the home can edit them, and nothing else holds what they say (the order and
time of events, a decision's reason, a session's commands). So the process that wrote one
signs a seal over its digest with the home's key: ``(kind, subject, seq, digest)``, the kind
and subject (the run id) inside the signed bytes so a seal cannot be moved to another record,
``seq`` saying how much of an append-only record (a trace: events 1..seq) the digest covers.
An attacker without the key can delete a seal but never make one, and audit requires them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Literal

from pydantic import Field

from choir._core.canonical import canonical_json
from choir.attest.keys import decode_public_key, key_id_of, verify_signature
from choir.exceptions import IntegrityError
from choir.models._base import Frozen

if TYPE_CHECKING:
    from choir.attest import SigningKey

SEAL_TYPE = "choir.record-seal/v1"
SealKind = Literal["trace", "verify_session"]


class Seal(Frozen):
    """A signed ``(kind, subject, seq, digest)``; every field bounded (a seal is read back from
    a file anyone with the home can write)."""

    kind: SealKind
    subject: str = Field(min_length=1, max_length=200)
    seq: int = Field(default=0, ge=0)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    key_id: str = Field(max_length=64)
    public_key: str = Field(max_length=64)
    signature: str = Field(max_length=128)


def seal_bytes(kind: str, subject: str, seq: int, digest: str) -> bytes:
    """The bytes a seal signs."""
    return canonical_json({"type": SEAL_TYPE, "kind": kind, "subject": subject, "seq": seq,
                           "digest": digest})


def make_seal(kind: SealKind, subject: str, seq: int, digest: str, signer: SigningKey) -> Seal:
    return Seal(kind=kind, subject=subject, seq=seq, digest=digest, key_id=signer.key_id,
                public_key=signer.public_key,
                signature=signer.sign(seal_bytes(kind, subject, seq, digest)))


def seal_problem(seal: Seal, *, kind: str, subject: str, digest: str,
                 trusted: Collection[str] | None) -> str | None:
    """Why ``seal`` does not vouch for ``digest`` as ``kind`` record ``subject``, or None.

    The key id is recomputed from the public key the seal carries, never taken from it.
    ``trusted`` None: only what the seal names is compared, its signature not checked (a
    seal that only restates what a later, verified seal covers need not be).
    """
    if seal.kind != kind or seal.subject != subject:
        return f"a seal of {seal.kind} {seal.subject!r}, not of {kind} {subject!r}"
    if seal.digest != digest:
        return f"the record hashes to {digest}, not the sealed {seal.digest}"
    if trusted is None:
        return None
    try:
        key_id = key_id_of(decode_public_key(seal.public_key).public_bytes_raw())
    except ValueError:
        return "the seal's public key is not an ed25519 key"
    if not verify_signature(seal.public_key, seal_bytes(seal.kind, seal.subject, seal.seq,
                                                        seal.digest), seal.signature):
        return "the seal's signature does not verify"
    if key_id not in trusted:
        return f"sealed by key {key_id}, which this home does not trust"
    return None


def open_record(path: Path) -> BinaryIO:
    """A record file opened for reading, never through a link and never a FIFO or device
    (a planted one would hang or redirect ``choir audit``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IntegrityError: ``path`` is a link or not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise IntegrityError(f"{path}: not a readable record ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IntegrityError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")
