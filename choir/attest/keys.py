"""Keys as the rest of Choir sees them: signers, signatures and the pinned trust root.

One ed25519 key per ``CHOIR_HOME``, created on first use. The private key is read and
written only by ``choir.trusted`` (its broker process and ``choir keys``); ``load_signer``
hands out a ``BrokerSigner`` that signs through the broker. This module verifies.

Trust is pinned, not found: ``trust_root`` reads the key ids to trust from
``CHOIR_TRUSTED_KEYS`` or ``$CHOIR_HOME/trusted_keys``.

A key id is the first 32 hex characters of blake3 over the raw public key, so anyone holding
an attestation can recompute it from the public key it carries.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from choir._core.paths import choir_home
from choir.exceptions import ConfigError, UserError
from choir.models import Violation
from choir.trusted import BrokerSigner
from choir.trusted import signer as broker_signer
from choir.trusted.confine import confinement
from choir.trusted.keyfile import (
    KEY_FILE,
    KEY_ID_LEN,
    PUB_FILE,
    Signer,
    SigningKey,
    key_id_of,
    publish,
)
from choir.trusted.keylists import REVOKE_FILE as REVOKE_FILE
from choir.trusted.keylists import TRUST_ENV as TRUST_ENV
from choir.trusted.keylists import _parse_ids, _read_list, _why
from choir.trusted.keylists import revoked_key_ids as revoked_key_ids

__all__ = ["KEY_FILE", "KEY_ID_LEN", "PUB_FILE", "BrokerSigner", "Signer", "SigningKey",
           "key_id_of"]

if TYPE_CHECKING:
    from choir.models import Attestation, Violation


def load_signer(home: Path | None = None) -> BrokerSigner:
    """The signer of this ``CHOIR_HOME``: its broker process, which creates the key on first
    use (``choir.trusted.signer``, the one place a signer is built).

    Raises:
        IntegrityError: the key file exists but is unreadable, not ed25519, or readable by
            group or others.
    """
    return broker_signer(home)


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


PIN_FILE = "trusted_keys"


@dataclass(frozen=True)
class TrustRoot:
    """The key ids whose signatures count, and where that list came from.

    ``source`` names the variable or file that pinned them; ``first_use`` is True when no pin
    existed and this home's own key was just recorded as the pin (trust on first use).
    ``keys`` never holds a revoked id: ``revoked`` lists them, so a check can name why a
    key does not count (``key_revoked``) instead of only that it does not.
    """

    keys: frozenset[str]
    source: str
    first_use: bool = False
    revoked: frozenset[str] = frozenset()

    def describe(self) -> str:
        """One line for ``gate`` and ``audit`` answers: the pinned ids and their source."""
        line = f"trusted keys ({self.source}): {', '.join(sorted(self.keys)) or 'none'}"
        return line + (f"; revoked: {', '.join(sorted(self.revoked))}" if self.revoked else "")


def trust_root(home: Path | None = None) -> TrustRoot:
    """The pinned trusted keys: ``$CHOIR_TRUSTED_KEYS``, else ``$CHOIR_HOME/trusted_keys``.

    Like in-toto/SLSA verification, only pinned key ids are trusted; a ``.pub`` file dropped
    somewhere is not. ``CHOIR_TRUSTED_KEYS=id1,id2`` (what a CI system sets) wins over the
    file (one id per line, ``#`` comments). With neither, this home's own signing key is
    recorded in the file on first use (TOFU, reported as ``first_use``): replacing the key
    pair afterwards makes every new signature untrusted, so it cannot go unnoticed. The file
    lives in ``CHOIR_HOME``, which no sandboxed step can write; an executor running on the
    host as the same user can, which is why CI should pin with the variable.

    Revoked ids (``revoked_key_ids``) are taken out of the pinned ones, whoever pinned them.

    Raises:
        ConfigError: the variable or file is malformed or names no key (naming the line).
    """
    revoked = revoked_key_ids(home)
    env = os.environ.get(TRUST_ENV)
    if env is not None and env.strip():
        return TrustRoot(_parse_ids(env, path=TRUST_ENV, lines=False) - revoked, TRUST_ENV,
                         revoked=revoked)
    base = home or choir_home()
    pin = base / PIN_FILE
    first_use = False
    if not os.path.lexists(pin):  # a link (dangling or not) is refused below, not replaced
        signer = load_signer(home)
        note = (f"# Choir trusted key ids, one per line (pinned on first use; {TRUST_ENV} "
                f"overrides)\n{signer.key_id}\n")
        base.mkdir(parents=True, exist_ok=True)
        publish(base, PIN_FILE, note.encode("ascii"), 0o600)
        first_use = True
    try:
        text = _read_list(base, PIN_FILE)
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read the pinned key list: {_why(err)}", path=str(pin),
                          hint=f"make it a plain file of key ids, or remove it, or set "
                               f"{TRUST_ENV}") from None
    return TrustRoot(_parse_ids(text, path=str(pin), lines=True) - revoked, str(pin),
                     first_use, revoked)


def pinned_trust_root(home: Path | None = None) -> TrustRoot | None:
    """``trust_root`` when keys are pinned (``$CHOIR_TRUSTED_KEYS`` or the file), else None:
    for the commands that only read (``choir runs``, ``choir view``), which must not pin,
    since pinning on first use creates this home's signing key.

    Raises:
        ConfigError: what is pinned is malformed (``trust_root``).
    """
    env = os.environ.get(TRUST_ENV)
    if (env is not None and env.strip()) or os.path.lexists((home or choir_home()) / PIN_FILE):
        return trust_root(home)
    return None


def key_refusal(key_id: str, trusted: Collection[str], revoked: Collection[str]
                ) -> tuple[str, str] | None:
    """Why ``key_id`` does not count, as (violation suffix, expected), or None when it does.

    The one wording for attestations and signed heads alike: ``key_revoked`` for a revoked
    id, ``untrusted_key`` for one nobody pinned.
    """
    if key_id in revoked:
        return "key_revoked", "a key that is not revoked"
    if key_id not in trusted:
        return "untrusted_key", "a trusted key"
    return None


def trusted_key_ids(home: Path | None = None) -> set[str]:
    """Key ids this ``CHOIR_HOME`` trusts: the pinned list less the revoked (``trust_root``)."""
    return set(trust_root(home).keys)


def trust_violations(home: Path | None = None) -> list[Violation]:
    """What ``audit`` reports about the trust root itself: a signing key nobody pinned.

    The home's own key not being in the pinned list means the key pair was replaced (or the
    pin names another signer): everything it signs is untrusted, and audit says so by name.
    """

    base = home or choir_home()
    root = trust_root(home)
    if not (base / "keys" / KEY_FILE).exists() and confinement(base / "keys") is None:
        return []  # no key yet (a confined process cannot see it, but its broker can)
    key_id = load_signer(home).key_id
    if key_id in root.revoked:
        return [Violation(kind="signer_revoked", object=str(base / "keys" / KEY_FILE),
                          expected="a signing key that is not revoked",
                          found=f"{key_id}: run `choir keys rotate`")]
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



def require_pinned_signer(home: Path | None = None) -> BrokerSigner:
    """This home's signer, refused up front when the pin does not trust it.

    A run whose attestations could never count would verify for nothing and then fail on
    its first AHDB write; say so before any work starts.

    Raises:
        UserError: the signing key is not among the pinned trusted keys.
    """

    signer = load_signer(home)
    root = trust_root(home)
    if signer.key_id in root.revoked:
        raise UserError(f"this home's signing key {signer.key_id} is revoked\n  fix: run "
                        "`choir keys rotate` to make a new key and pin it")
    if signer.key_id not in root.keys:
        raise UserError(
            f"this home's signing key {signer.key_id} is not among the trusted keys pinned by "
            f"{root.source}, so nothing it attests could count\n  fix: add {signer.key_id} "
            f"to {root.source}, or run with the key that is pinned")
    return signer
