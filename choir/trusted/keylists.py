"""The key lists a home keeps beside its key, read as hostile files: ids parsed strictly,
files read bounded, never through a link, a FIFO or a device.

Here, below ``choir.attest``, because the signing broker reads the revoked list too (it
re-signs an attestation as a DSSE export only under a key that is not revoked, review 21c),
and the broker's package imports nothing above its own layer.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from choir._core import fsopen
from choir._core.paths import choir_home
from choir.exceptions import ConfigError
from choir.trusted.keyfile import KEY_ID_LEN

TRUST_ENV = "CHOIR_TRUSTED_KEYS"
REVOKE_ENV = "CHOIR_REVOKED_KEYS"
REVOKE_FILE = "revoked_keys"


def _parse_ids(text: str, *, path: str, lines: bool, empty_ok: bool = False
               ) -> frozenset[str]:
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
    if not ids and not empty_ok:
        raise ConfigError("names no key id, so no attestation could ever count", path=path,
                          hint=f"list at least one key id, or unset {TRUST_ENV} / remove "
                               "the file to trust this home's own key on first use")
    return frozenset(ids)


MAX_LIST = 1 << 20
"""A key list is 33 bytes a key; a megabyte is thirty thousand keys."""


def _read_list(base: Path, name: str) -> str:
    """A key list, read as ``choir._core.fsopen`` opens: never through a link, never a FIFO
    or a device (one planted here hung ``choir audit`` and ``choir gate``, a link to
    ``/dev/zero`` ran them out of memory: review 21, F2), at most ``MAX_LIST`` bytes.

    Raises:
        OSError: missing, a link, not a regular file, or larger than ``MAX_LIST``.
        UnicodeDecodeError: not UTF-8.
    """
    data = fsopen.read_bytes(base, name, MAX_LIST + 1)
    if len(data) > MAX_LIST:
        raise OSError(errno.EFBIG, f"larger than {MAX_LIST} bytes")
    return data.decode("utf-8")


def _why(err: OSError | UnicodeDecodeError) -> str:
    if isinstance(err, OSError) and err.errno == errno.ELOOP:
        return "it is a symbolic link (a key list is read only as a plain file)"
    if isinstance(err, OSError) and err.errno == errno.EINVAL:
        return "it is not a regular file (a FIFO or a device?)"
    return str(err.strerror if isinstance(err, OSError) and err.strerror else err)


def revoked_key_ids(home: Path | None = None) -> frozenset[str]:
    """Key ids that never count again: ``$CHOIR_REVOKED_KEYS`` and ``$CHOIR_HOME/revoked_keys``.

    Both count (a revocation only ever adds): a CI system can revoke by the variable
    without touching the home, and ``choir keys revoke`` writes the file. A revoked key may
    have signed anything, at any date it liked, so everything it signed is refused.

    Raises:
        ConfigError: the variable or file is malformed (naming the line).
    """
    ids: frozenset[str] = frozenset()
    env = os.environ.get(REVOKE_ENV, "")
    if env.strip():
        ids |= _parse_ids(env, path=REVOKE_ENV, lines=False, empty_ok=True)
    path = (home or choir_home()) / REVOKE_FILE
    try:
        text = _read_list(path.parent, REVOKE_FILE)
    except FileNotFoundError:  # a link, dangling or not, is refused below: never followed
        return ids
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read the revoked key list: {_why(err)}", path=str(path),
                          hint="make it a plain file of key ids; removing it would trust "
                               "revoked keys again") from None
    return ids | _parse_ids(text, path=str(path), lines=True, empty_ok=True)


__all__ = ["MAX_LIST", "REVOKE_ENV", "REVOKE_FILE", "TRUST_ENV", "revoked_key_ids"]
