"""The signing key: one ed25519 key per ``CHOIR_HOME``, created on first use.

Files: ``$CHOIR_HOME/keys/ed25519.key`` (PKCS#8 PEM, mode 0600, directory 0700) and
``ed25519.pub`` beside it (base64 of the 32 raw public-key bytes). Creation is safe when
several processes race: each writes a complete key to a private temp file and hard-links it
to the final name; ``link`` fails if the name exists, so exactly one key wins and the losers
read it. A reader never sees a half-written key.

Trust is pinned, not found: ``trust_root`` reads the key ids to trust from
``CHOIR_TRUSTED_KEYS`` or ``$CHOIR_HOME/trusted_keys``.

A key id is the first 32 hex characters of blake3 over the raw public key, so anyone holding
an attestation can recompute it from the public key it carries.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from choir._core.canonical import blake3_hex
from choir._core.paths import choir_home
from choir.exceptions import ConfigError, IntegrityError, UserError
from choir.models import Violation

if TYPE_CHECKING:
    from choir.models import Attestation, Violation

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


TRUST_ENV = "CHOIR_TRUSTED_KEYS"
PIN_FILE = "trusted_keys"


@dataclass(frozen=True)
class TrustRoot:
    """The key ids whose signatures count, and where that list came from.

    ``source`` names the variable or file that pinned them; ``first_use`` is True when no pin
    existed and this home's own key was just recorded as the pin (trust on first use).
    """

    keys: frozenset[str]
    source: str
    first_use: bool = False

    def describe(self) -> str:
        """One line for ``gate`` and ``audit`` answers: the pinned ids and their source."""
        return f"trusted keys ({self.source}): {', '.join(sorted(self.keys))}"


def _parse_ids(text: str, *, path: str, lines: bool) -> frozenset[str]:
    ids: set[str] = set()
    items = text.splitlines() if lines else text.split(",")
    for number, raw in enumerate(items, start=1):
        item = raw.split("#", 1)[0].strip()
        if not item:
            continue
        if len(item) != KEY_ID_LEN or any(c not in "0123456789abcdef" for c in item):
            raise ConfigError(
                f"{item[:80]!r} is not a key id ({KEY_ID_LEN} lower-case hex characters)",
                path=path, line=number if lines else None,
                hint="list key ids as `choir gate` and `choir audit` print them "
                     "(the signer's id is in every attestation's signer_key_id)")
        ids.add(item)
    if not ids:
        raise ConfigError("names no key id, so no attestation could ever count", path=path,
                          hint=f"list at least one key id, or unset {TRUST_ENV} / remove "
                               "the file to trust this home's own key on first use")
    return frozenset(ids)


def trust_root(home: Path | None = None) -> TrustRoot:
    """The pinned trusted keys: ``$CHOIR_TRUSTED_KEYS``, else ``$CHOIR_HOME/trusted_keys``.

    Like in-toto/SLSA verification, only pinned key ids are trusted; a ``.pub`` file dropped
    somewhere is not. ``CHOIR_TRUSTED_KEYS=id1,id2`` (what a CI system sets) wins over the
    file (one id per line, ``#`` comments). With neither, this home's own signing key is
    recorded in the file on first use (TOFU, reported as ``first_use``): replacing the key
    pair afterwards makes every new signature untrusted, so it cannot go unnoticed. The file
    lives in ``CHOIR_HOME``, which no sandboxed step can write; an executor running on the
    host as the same user can, which is why CI should pin with the variable.

    Raises:
        ConfigError: the variable or file is malformed or names no key (naming the line).
    """
    env = os.environ.get(TRUST_ENV)
    if env is not None and env.strip():
        return TrustRoot(_parse_ids(env, path=TRUST_ENV, lines=False), TRUST_ENV)
    base = home or choir_home()
    pin = base / PIN_FILE
    first_use = False
    if not pin.exists():
        signer = load_signer(home)
        note = (f"# Choir trusted key ids, one per line (pinned on first use; {TRUST_ENV} "
                f"overrides)\n{signer.key_id}\n")
        base.mkdir(parents=True, exist_ok=True)
        _publish(base, PIN_FILE, note.encode("ascii"), 0o600)
        first_use = True
    try:
        text = pin.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read the pinned key list: {err}", path=str(pin),
                          hint=f"fix or remove it, or set {TRUST_ENV}") from None
    return TrustRoot(_parse_ids(text, path=str(pin), lines=True), str(pin), first_use)


def trusted_key_ids(home: Path | None = None) -> set[str]:
    """Key ids this ``CHOIR_HOME`` trusts: exactly the pinned list (``trust_root``)."""
    return set(trust_root(home).keys)


def trust_violations(home: Path | None = None) -> list[Violation]:
    """What ``audit`` reports about the trust root itself: a signing key nobody pinned.

    The home's own key not being in the pinned list means the key pair was replaced (or the
    pin names another signer): everything it signs is untrusted, and audit says so by name.
    """

    base = home or choir_home()
    root = trust_root(home)
    if not (base / "keys" / KEY_FILE).exists():
        return []
    key_id = load_signer(home).key_id
    if key_id in root.keys:
        return []
    return [Violation(kind="signer_not_pinned", object=str(base / "keys" / KEY_FILE),
                      expected=f"a key pinned by {root.source}"[:200], found=key_id)]


def signer_counts(attestations: Iterable[Attestation]) -> dict[str, int]:
    """How many attestations each key id signed (recomputed from the key each carries)."""
    counts: dict[str, int] = {}
    for att in attestations:
        try:
            key_id = key_id_of(decode_public_key(att.public_key).public_bytes_raw())
        except ValueError:
            key_id = f"unreadable:{att.signer_key_id[:32]}"
        counts[key_id] = counts.get(key_id, 0) + 1
    return counts



def require_pinned_signer(home: Path | None = None) -> Signer:
    """This home's signer, refused up front when the pin does not trust it.

    A run whose attestations could never count would verify for nothing and then fail on
    its first AHDB write; say so before any work starts.

    Raises:
        UserError: the signing key is not among the pinned trusted keys.
    """

    signer = load_signer(home)
    root = trust_root(home)
    if signer.key_id not in root.keys:
        raise UserError(
            f"this home's signing key {signer.key_id} is not among the trusted keys pinned by "
            f"{root.source}, so nothing it attests could count\n  fix: add {signer.key_id} "
            f"to {root.source}, or run with the key that is pinned")
    return signer
