"""The signing key: one ed25519 key per ``CHOIR_HOME``, created on first use.

Files: ``$CHOIR_HOME/keys/ed25519.key`` (PKCS#8 PEM, mode 0600, directory 0700) and
``ed25519.pub`` beside it (base64 of the 32 raw public-key bytes). Creation is safe when
several processes race: each writes a complete key to a private temp file and hard-links it
to the final name; ``link`` fails if the name exists, so exactly one key wins and the losers
read it. A reader never sees a half-written key.

A key id is the first 32 hex characters of blake3 over the raw public key, so anyone holding
an attestation can recompute it from the public key it carries.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from choir._canonical import blake3_hex
from choir._paths import choir_home
from choir.exceptions import IntegrityError

KEY_FILE = "ed25519.key"
PUB_FILE = "ed25519.pub"
KEY_ID_LEN = 32


def key_id_of(public_key_raw: bytes) -> str:
    """The key id of a raw 32-byte ed25519 public key."""
    return blake3_hex(public_key_raw)[:KEY_ID_LEN]


def _b64decode(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def decode_public_key(public_key_b64: str) -> Ed25519PublicKey:
    """Parse a base64 raw ed25519 public key.

    Raises:
        ValueError: not base64, or not 32 bytes.
    """
    try:
        raw = _b64decode(public_key_b64)
    except (binascii.Error, UnicodeEncodeError) as err:
        raise ValueError(f"public key is not base64: {err}") from None
    if len(raw) != 32:
        raise ValueError(f"an ed25519 public key has 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def verify_signature(public_key_b64: str, data: bytes, signature_b64: str) -> bool:
    """True only when ``signature_b64`` is a valid ed25519 signature of ``data``; never raises."""
    try:
        key = decode_public_key(public_key_b64)
        key.verify(_b64decode(signature_b64), data)
    except (ValueError, TypeError, binascii.Error, UnicodeEncodeError, InvalidSignature):
        return False
    return True


@dataclass(frozen=True)
class Signer:
    """A loaded private key. ``public_key`` is base64 of the raw 32 bytes."""

    private_key: Ed25519PrivateKey = field(repr=False)
    public_key: str
    key_id: str

    @classmethod
    def from_private_key(cls, private_key: Ed25519PrivateKey) -> Signer:
        """Wrap a key (tests and callers holding keys elsewhere use this)."""
        raw = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return cls(private_key, base64.b64encode(raw).decode("ascii"), key_id_of(raw))

    @classmethod
    def generate(cls) -> Signer:
        """A fresh in-memory key, never written anywhere."""
        return cls.from_private_key(Ed25519PrivateKey.generate())

    def sign(self, data: bytes) -> str:
        """Base64 ed25519 signature of ``data``."""
        return base64.b64encode(self.private_key.sign(data)).decode("ascii")


def _write_new(directory: Path, data: bytes, mode: int) -> Path:
    tmp = directory / f".tmp-{os.getpid()}-{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _publish(directory: Path, name: str, data: bytes, mode: int) -> None:
    """Create ``directory/name`` with ``data`` unless it exists (atomic, no clobber)."""
    tmp = _write_new(directory, data, mode)
    try:
        os.link(tmp, directory / name)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def _load_private(path: Path) -> Ed25519PrivateKey:
    st = path.stat()
    if st.st_mode & 0o077:
        raise IntegrityError(
            f"{path} is readable by others (mode {st.st_mode & 0o777:o}): "
            f"run `chmod 600 {path}`; a shared key cannot vouch for anything"
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except ValueError as err:
        raise IntegrityError(f"{path} is not a readable ed25519 key: {err}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IntegrityError(f"{path} holds a {type(key).__name__}, not an ed25519 key")
    return key


def load_signer(home: Path | None = None) -> Signer:
    """The signer of this ``CHOIR_HOME``, creating its key on first use.

    Raises:
        IntegrityError: the key file exists but is unreadable, not ed25519, or readable by
            group or others.
    """
    keys = (home or choir_home()) / "keys"
    keys.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(keys, 0o700)
    key_path = keys / KEY_FILE
    if not key_path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _publish(keys, KEY_FILE, pem, 0o600)
    signer = Signer.from_private_key(_load_private(key_path))
    pub_path = keys / PUB_FILE
    pub_text = (signer.public_key + "\n").encode("ascii")
    if not pub_path.exists() or pub_path.read_bytes() != pub_text:
        tmp = _write_new(keys, pub_text, 0o644)
        os.replace(tmp, pub_path)
    return signer


def trusted_key_ids(home: Path | None = None) -> set[str]:
    """Key ids this ``CHOIR_HOME`` trusts: its own key plus ``keys/trusted/*.pub``.

    Each trusted file holds one base64 raw public key (the format of ``ed25519.pub``), so
    trusting another machine's signer is copying its ``.pub`` file. Unreadable files are
    skipped: trust is only ever granted by a well-formed key.
    """
    base = (home or choir_home()) / "keys"
    ids = {load_signer(home).key_id}
    for path in sorted((base / "trusted").glob("*.pub")):
        try:
            raw = decode_public_key(path.read_text("ascii").strip()).public_bytes_raw()
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        ids.add(key_id_of(raw))
    return ids
