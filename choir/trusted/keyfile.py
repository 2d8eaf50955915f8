"""The signing key on disk: the only code that reads or writes a private key.

Files: ``$CHOIR_HOME/keys/ed25519.key`` (PKCS#8 PEM, mode 0600, directory 0700) and
``ed25519.pub`` beside it (base64 of the 32 raw public-key bytes). Creation is safe when
several processes race: each writes a complete key to a private temp file and hard-links it
to the final name; ``link`` fails if the name exists, so exactly one key wins and the losers
read it. A reader never sees a half-written key.

Rotation keeps every earlier public key in ``keys/retired/<key id>.pub`` (public bytes only),
so attestations signed before the rotation still name a key that can be looked up; the old
private key file is replaced. Only the broker process (``choir.trusted.broker``) and the
``choir keys`` command call ``load_key``; everything else signs through the broker.

A key id is the first 32 hex characters of blake3 over the raw public key, so anyone holding
an attestation can recompute it from the public key it carries.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from choir._core import fsopen
from choir._core.canonical import blake3_hex
from choir.exceptions import IntegrityError
from choir.trusted.confine import keys_dir

KEY_FILE = "ed25519.key"
PUB_FILE = "ed25519.pub"
RETIRED_DIR = "retired"
KEY_ID_LEN = 32


def key_id_of(public_key_raw: bytes) -> str:
    """The key id of a raw 32-byte ed25519 public key."""
    return blake3_hex(public_key_raw)[:KEY_ID_LEN]


class SigningKey(Protocol):
    """What every signer offers: an in-process ``Signer`` or the broker's ``BrokerSigner``."""

    @property
    def key_id(self) -> str: ...

    @property
    def public_key(self) -> str: ...

    def sign(self, data: bytes) -> str: ...


@dataclass(frozen=True)
class Signer:
    """A private key held in this process. ``public_key`` is base64 of the raw 32 bytes.

    Only the broker and tests hold one; every other caller gets a ``BrokerSigner`` with the
    same ``key_id``, ``public_key`` and ``sign``.
    """

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


def write_new(directory: Path, data: bytes, mode: int, *, dir_fd: int | None = None) -> Path:
    """A private temp file in ``directory`` holding ``data`` (fsynced); the caller links it.

    With ``dir_fd`` (a descriptor of that folder) it is made there, wherever the folder now
    is, and only its name is returned, for the ``dir_fd`` arguments of ``os.link`` and
    ``os.replace``.
    """
    name = f".tmp-{os.getpid()}-{secrets.token_hex(8)}"
    tmp = Path(name) if dir_fd is not None else directory / name
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode,
                 dir_fd=dir_fd)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def publish(directory: Path, name: str, data: bytes, mode: int, *,
            dir_fd: int | None = None) -> None:
    """Create ``directory/name`` with ``data`` unless it exists (atomic, no clobber); in the
    folder ``dir_fd`` when given (``write_new``)."""
    tmp = write_new(directory, data, mode, dir_fd=dir_fd)
    try:
        os.link(tmp, name if dir_fd is not None else directory / name,
                src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileExistsError:
        pass
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)


def open_keys(home: Path, *, make: bool = True) -> int:
    """An ``O_PATH`` descriptor of ``home/keys`` (made owner-only first unless ``make`` is
    off): the key is read, made and replaced relative to it, so a folder moved in between
    is never half this one and half another.

    Raises:
        OSError: the folder is missing (``make`` off) or not a folder.
    """
    keys = keys_dir(home) if make else home / "keys"
    return os.open(keys, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def _present(keys_fd: int) -> bool:
    """Whether ``KEY_FILE`` exists in the folder (anything there but a key fails to load)."""
    try:
        os.stat(KEY_FILE, dir_fd=keys_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True


def _load_private(keys_fd: int, path: Path) -> Ed25519PrivateKey:
    """The key ``KEY_FILE`` in the folder ``keys_fd`` (``path`` names it in errors)."""
    try:  # a FIFO planted here would block the open and the read: never waited on
        fd = os.open(KEY_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=keys_fd)
    except OSError as err:
        raise IntegrityError(f"{path} cannot be opened as a key file: {err}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise IntegrityError(f"{path} is not a regular file (a FIFO or a device?): "
                                 "restore the key file, or remove it to make a new key")
        os.set_blocking(fd, True)
        if st.st_mode & 0o077:
            raise IntegrityError(
                f"{path} is readable by others (mode {st.st_mode & 0o777:o}): "
                f"run `chmod 600 {path}`; a shared key cannot vouch for anything")
        pem = fh.read(1 << 16)
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except ValueError as err:
        raise IntegrityError(f"{path} is not a readable ed25519 key: {err}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IntegrityError(f"{path} holds a {type(key).__name__}, not an ed25519 key")
    return key


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write_pub(keys: Path, keys_fd: int, signer: Signer) -> None:
    """Keep ``ed25519.pub`` the key's: read bounded, never through a link and never a FIFO
    (one planted here hung the broker at start: review 21, F2); anything else is replaced."""
    pub_text = (signer.public_key + "\n").encode("ascii")
    try:  # missing, a link, a FIFO, a device, a folder: written afresh
        fd, _st = fsopen.open_regular(PUB_FILE, keys_fd)
        with os.fdopen(fd, "rb") as fh:
            current = fh.read(len(pub_text) + 1)
    except OSError:
        current = b""
    if current != pub_text:
        os.replace(write_new(keys, pub_text, 0o644, dir_fd=keys_fd), PUB_FILE,
                   src_dir_fd=keys_fd, dst_dir_fd=keys_fd)


_held: dict[str, tuple[Path, Path | int, str]] = {}


def held_key() -> tuple[Path, Path | int, str] | None:
    """The home, its key folder and the public key (base64) ``load_key`` last loaded in
    this process: in the broker, the folder it pinned (a descriptor: never ``home/keys``
    found again by path, review 24a F3) and the key it signs with (``choir.trusted.checks``
    checks a DSSE export against it and the keys retired in that folder)."""
    return _held.get("key")


def load_key(home: Path, keys_fd: int | None = None) -> Signer:
    """The key of ``home``, created on first use. Runs in the broker, never elsewhere.

    ``keys_fd`` is the broker's descriptor of the key folder it pinned at start: the key is
    then made, read and published in that folder wherever it now is, never found again by
    path (a step that moved the home away and made another at its path had its own key
    loaded: review 24a, F3). Without it, ``home/keys`` is opened here.

    Raises:
        IntegrityError: the key file exists but is unreadable, not ed25519, a link, or
            readable by group or others.
    """
    keys = home / "keys"
    fd = open_keys(home) if keys_fd is None else keys_fd
    try:
        if not _present(fd):
            publish(keys, KEY_FILE, _pem(Ed25519PrivateKey.generate()), 0o600, dir_fd=fd)
        signer = Signer.from_private_key(_load_private(fd, keys / KEY_FILE))
        _write_pub(keys, fd, signer)
    finally:
        if keys_fd is None:
            os.close(fd)
    _held["key"] = (home, keys if keys_fd is None else keys_fd, signer.public_key)
    return signer


def rotate_key(home: Path) -> tuple[str | None, Signer]:
    """Replace the key of ``home`` with a new one; returns (the old key id, the new signer).

    The old public key is kept in ``keys/retired/<id>.pub``; the old private key is
    replaced in place (``rename`` over it), so no file in the home holds it any more (its
    blocks are not shredded: revoke a key that may have leaked).
    """
    keys, fd = home / "keys", open_keys(home)
    try:
        old: str | None = None
        if _present(fd):
            current = Signer.from_private_key(_load_private(fd, keys / KEY_FILE))
            old = current.key_id
            retired = keys / RETIRED_DIR
            retired.mkdir(exist_ok=True, mode=0o755)
            publish(retired, f"{old}.pub", (current.public_key + "\n").encode("ascii"),
                    0o644)
        fresh = Signer.from_private_key(Ed25519PrivateKey.generate())
        os.replace(write_new(keys, _pem(fresh.private_key), 0o600, dir_fd=fd), KEY_FILE,
                   src_dir_fd=fd, dst_dir_fd=fd)
        _write_pub(keys, fd, fresh)
    finally:
        os.close(fd)
    return old, fresh
