"""The trusted core: the signing key, held by a broker process apart from hostile bytes.

Choir's main process walks trees an executor arranged, reads logs and ``$CHOIR_OUT`` that
steps wrote and parses them; any bug there must not reach the key. So the key lives in a
broker (``choir.trusted.broker``) that signs only typed, bounded requests it recognises
(``choir.trusted.checks``), and ``separate`` hides the key folder from the main process
(``choir.trusted.confine``). ``signer`` is the one place that builds a signer: every caller
(attestations, AHDB heads, records, DSSE exports) gets a ``BrokerSigner`` from it.
"""

from __future__ import annotations

import atexit
import importlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from choir._core.paths import choir_home
from choir.trusted.confine import keys_dir

if TYPE_CHECKING:
    import socket

    from choir.trusted.client import BrokerSigner
    from choir.trusted.keyfile import KEY_FILE, Signer, key_id_of
    from choir.trusted.protocol import Reply

# the names that need pydantic and cryptography, imported on first use: `choir verify`
# confines itself through this package before it knows whether it needs either
_LAZY = {"BrokerSigner": "choir.trusted.client", "KEY_FILE": "choir.trusted.keyfile",
         "Signer": "choir.trusted.keyfile", "key_id_of": "choir.trusted.keyfile"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_MAX_BROKERS = 4
_brokers: OrderedDict[Path, BrokerSigner] = OrderedDict()
_lock = threading.Lock()
# the first key each home's signer gave this process: a fork that adopts a copy of the broker
# (``choir serve``'s worker) is stale once the broker holds another (``choir keys rotate``)
_first_told: dict[Path, Reply | None] = {}


def close_all() -> None:
    """Close every broker this process started (each exits and is reaped); runs at exit."""
    with _lock:
        while _brokers:
            _brokers.popitem()[1].close()


atexit.register(close_all)


def signer(home: Path | None = None) -> BrokerSigner:
    """The signer of ``home`` (default ``CHOIR_HOME``): its broker, started on first use.

    Raises:
        IntegrityError: the broker cannot load the key (unreadable, not ed25519, shared,
            or hidden because this process was confined before its broker started).
    """
    base = (home or choir_home()).absolute()
    client = _started(base)
    client.key_id  # noqa: B018 (asks for the key: a broker that cannot load it raises here)
    _first_told.setdefault(base, client._hello)  # for the forks ``adopt`` serves
    return client


def _started(base: Path) -> BrokerSigner:
    from choir.exceptions import IntegrityError
    from choir.trusted.broker import spawn
    from choir.trusted.client import BrokerSigner
    from choir.trusted.confine import confinement

    with _lock:
        found = _brokers.get(base)
        confined = confinement(base / "keys") not in (None, "process")
        if found is not None:
            # after `choir keys rotate` a process that sees the key folder starts a broker
            # of its own, as before; a confined one cannot, and goes on with this one,
            # which loaded the new key (its signer answers with the new key id)
            if found.usable(same_key=not confined):
                _brokers.move_to_end(base)
                return found
            found.close()
            if confined:
                # a broker forked now would find the masked, empty key folder
                hid = "this command hid the key folder from itself when it started"
                if found.refusal:  # what the broker said, and its fix
                    raise IntegrityError(f"the signing broker of {base} cannot sign, and "
                                         f"{hid}: {found.refusal}")
                raise IntegrityError(
                    f"the signing broker of {base} stopped or cannot load its key, and "
                    f"{hid}\n  fix: run the command again (`choir keys show` says whether "
                    "the key loads)")
        client = BrokerSigner(base, *spawn(base))
        _brokers[base] = client
        while len(_brokers) > _MAX_BROKERS:
            _brokers.popitem(last=False)[1].close()
        return client


def adopt(home: Path, pid: int, sock: socket.socket) -> BrokerSigner:
    """Sign for ``home`` through the broker on ``sock`` (from ``BrokerSigner.channel``), in a
    fork whose key folder is masked and which therefore cannot start one; the channels this
    process inherited are closed here (their brokers serve the process that started them).
    The signer is returned (``usable``: whether its broker still holds the first key this
    process was told, the key file's until ``choir keys rotate``)."""
    from choir.trusted.client import BrokerSigner

    with _lock:
        while _brokers:
            _brokers.popitem()[1].close()
        adopted = _brokers[home.absolute()] = BrokerSigner(
            home.absolute(), pid, sock, _first_told.get(home.absolute()))
        return adopted


def separate(home: Path | None = None, *, make_key: bool = True) -> str:
    """Start the broker of ``home``, then hide its key folder from this process.

    Returns the confinement level (``choir.trusted.confine``). Call it before reading any
    hostile byte and before any thread starts. With ``make_key=False`` (a reader such as
    ``choir view``, which must not create a key) the broker starts only when the key exists;
    the folder is masked either way, so a key a run makes later is never in view.
    """
    from choir.trusted.confine import confine

    base = (home or choir_home()).absolute()
    present = make_key
    if not make_key:
        from choir.trusted.keyfile import KEY_FILE

        present = (base / "keys" / KEY_FILE).is_file()
    keys = keys_dir(base)  # the mount point must exist before the broker may create the key
    if present:
        _started(base)  # the broker loads the key while this process hides it from itself
    return confine(keys)


def broker_started(home: Path | None = None) -> bool:
    """True when this process holds a broker for ``home`` (``separate`` started one)."""
    with _lock:
        return (home or choir_home()).absolute() in _brokers


__all__ = ["KEY_FILE", "BrokerSigner", "Signer", "adopt", "broker_started", "key_id_of",
           "separate", "signer"]
