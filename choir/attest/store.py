"""Attestations on disk: ``$CHOIR_HOME/attestations/<id>.json``, atomic and write-once.

Each file is the canonical JSON of the whole attestation, mode 0444. It is written to a temp
file (in ``.tmp/``, named for its writer's pid), fsynced and hard-linked into place; ``link``
never replaces an existing name, so two writers cannot clobber each other and a reader never
sees half a file. The file name is the id, and ``get`` re-derives the id from the body, so a
swapped or edited file is caught.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from choir._core import fsopen
from choir._core.canonical import blake3_hex, canonical_json, is_hash
from choir._core.paths import artifact_dir, choir_home
from choir.attest.keys import signer_counts, trust_root
from choir.attest.mint import signed_bytes
from choir.evidence.artifacts import STALE_GRACE_S, STALE_MAX_S, remove_stale, write_once
from choir.exceptions import IntegrityError, NotFoundError, UserError
from choir.models import Attestation

MAX_FILE = 4 << 20
TMP = ".tmp"  # a writer's temp, named for its pid: a killed one's is cleared


class AttestationStore:
    """Write-once storage of attestations, keyed by id.

    With a Postgres store configured (``choir.config.store_url``), each one is also put in the
    shared index (``choir.attest.shared``) and read from it when this machine has no file.
    """

    def __init__(self, root: Path | None = None, *, reader: bool = False) -> None:
        """``reader``: a store only read (``choir view``): nothing is created in a shared
        database for it."""
        from choir.attest.shared import shared_index

        self.root = (root or choir_home() / "attestations").expanduser()
        self.root.mkdir(parents=True, exist_ok=True)
        self.shared = shared_index(self.root.parent, create=not reader)

    def path_of(self, att_id: str) -> Path:
        """Where attestation ``att_id`` is kept.

        Raises:
            IntegrityError: ``att_id`` is not a blake3 hex digest (it could escape the root).
        """
        if not isinstance(att_id, str) or not is_hash(att_id):
            raise IntegrityError(f"not an attestation id: {str(att_id)[:80]!r}")
        return self.root / f"{att_id}.json"

    def put(self, att: Attestation) -> Path:
        """Store ``att``; storing identical content again is a no-op.

        Raises:
            IntegrityError: the id does not match the body, or another attestation is already
                stored under this id.
        """
        if blake3_hex(signed_bytes(att.body)) != att.id:
            raise IntegrityError(f"attestation {att.id} does not match its body")
        data = canonical_json(att)
        path = self.path_of(att.id)
        tmp = self.root / TMP
        tmp.mkdir(mode=0o700, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(tmp).st_mode):  # a link: the temp would land there
            raise IntegrityError(f"{tmp} is not a folder of the store (a link, or a file)\n"
                                 "  fix: remove it; the store makes its own")
        write_once(path, data, f"attestation {att.id} is already stored with other content",
                   tmp / f"a-{os.getpid()}-{secrets.token_hex(8)}")
        if self.shared is not None:
            self.shared.put(att.id, data)
        return path

    def get(self, att_id: str) -> Attestation:
        """Load attestation ``att_id``. Its signature is not checked: see ``verify_attestation``.

        Raises:
            NotFoundError: no attestation has this id.
            IntegrityError: the file is unreadable, malformed, or does not hash to ``att_id``.
        """
        path = self.path_of(att_id)
        try:  # no link followed, a FIFO refused, never waited on (``fsopen``)
            data = fsopen.read_bytes(self.root, path.name, MAX_FILE + 1)
        except FileNotFoundError:
            shared = self.shared.get(att_id) if self.shared is not None else None
            if shared is None:
                raise NotFoundError(f"no attestation {att_id}") from None
            data = shared  # checked below exactly like a file
        except OSError as err:
            raise IntegrityError(f"attestation {att_id} is unreadable: {err}") from None
        if len(data) > MAX_FILE:
            raise IntegrityError(f"attestation {att_id} is larger than {MAX_FILE} bytes")
        try:
            att = Attestation.model_validate_json(data)
        except ValidationError as err:
            raise IntegrityError(f"attestation {att_id} is malformed: {err}") from None
        if att.id != att_id or blake3_hex(signed_bytes(att.body)) != att_id:
            raise IntegrityError(f"attestation file {att_id} does not hold attestation {att_id}")
        return att

    def ids(self) -> Iterator[str]:
        """Ids of the stored attestations (here and in the shared index), sorted."""
        local = {p.stem for p in self.root.glob("*.json") if is_hash(p.stem)}
        shared = set(self.shared.ids()) if self.shared is not None else set()
        yield from sorted(local | {i for i in shared if is_hash(i)})

    def find(self, prefix: str) -> str:
        """The one stored id that starts with ``prefix`` (a unique prefix is enough).

        Raises:
            UserError: no id, or several, start with it.
        """
        matches = [i for i in self.ids() if i.startswith(prefix)] if prefix else []
        if len(matches) != 1:
            raise UserError(
                f"no attestation matches '{prefix}'" if not matches
                else f"'{prefix}' matches {len(matches)} attestations; give more characters")
        return matches[0]

    def __contains__(self, att_id: object) -> bool:
        if not (isinstance(att_id, str) and is_hash(att_id)):
            return False
        return self.path_of(att_id).is_file() or (
            self.shared is not None and self.shared.get(att_id) is not None)

    def __iter__(self) -> Iterator[Attestation]:
        """Every stored attestation; a corrupt one raises ``IntegrityError`` when reached."""
        for att_id in self.ids():
            yield self.get(att_id)


def key_summary(home: Path | None = None) -> dict[str, Any]:
    """For ``audit`` answers: the key ids that signed stored attestations and the pin.

    ``{"signers": {key_id: count}, "trusted": [ids], "source": where the pin came from}``;
    unreadable attestations are audit's business and are not counted here.
    """
    base = home or choir_home()
    store = AttestationStore(base / "attestations")
    loaded = []
    for att_id in store.ids():
        try:
            loaded.append(store.get(att_id))
        except (IntegrityError, NotFoundError, OSError, ValueError):
            continue
    root = trust_root(home)
    return {"signers": signer_counts(loaded), "trusted": sorted(root.keys),
            "source": root.source}


def clear_stale_temps() -> int:
    """The temps writers killed mid-write left (``kill -9`` of an earlier command): in the
    artifact store's ``tmp/`` and the attestations' ``.tmp/``, each removed once its writer
    is gone and it is ten minutes old, or once it is a day old (``remove_stale``). Cleared
    in passing by every ``choir verify`` round, beside its snapshot; never raises."""
    removed = 0
    # by path, not through the stores: they would make their folders (a verify refused for
    # its configuration leaves none), and AttestationStore() may open a shared index
    for root, rel in ((artifact_dir(), "tmp"), (choir_home(), f"attestations/{TMP}")):
        with contextlib.suppress(OSError):
            removed += remove_stale(root, rel, max_age_s=STALE_MAX_S, grace_s=STALE_GRACE_S)
    return removed
