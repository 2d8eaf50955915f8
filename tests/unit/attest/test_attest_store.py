"""The attestation store: write-once, atomic, and suspicious of what it reads back."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from choir.attest import AttestationStore, Signer, mint, verify_attestation
from choir.exceptions import IntegrityError, NotFoundError
from choir.models import Attestation


def test_put_get_round_trip(evidence: Any, tmp_path: Path) -> None:
    store = AttestationStore()
    assert store.root == tmp_path / "home" / "attestations"
    att = mint(evidence.body, evidence.signer)
    path = store.put(att)
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert store.get(att.id) == att
    assert store.put(att) == path  # idempotent
    assert list(store.ids()) == [att.id]
    assert list(store) == [att]
    assert att.id in store
    # nothing beside it: its temp was in .tmp/, and is gone
    assert sorted(p.name for p in store.root.iterdir()) == [".tmp", f"{att.id}.json"]
    assert list((store.root / ".tmp").iterdir()) == []


def test_refuses_different_content_under_an_existing_id(evidence: Any) -> None:
    store = AttestationStore()
    att = mint(evidence.body, evidence.signer)
    store.put(att)
    rival = mint(evidence.body, Signer.generate())  # same body, so same id, other signer
    assert rival.id == att.id
    with pytest.raises(IntegrityError, match="other content"):
        store.put(rival)
    assert store.get(att.id) == att


def test_refuses_an_id_that_does_not_match_the_body(evidence: Any) -> None:
    att = mint(evidence.body, evidence.signer)
    with pytest.raises(IntegrityError):
        AttestationStore().put(att.model_copy(update={"id": "0" * 64}))


def test_missing_is_not_found(evidence: Any) -> None:
    store = AttestationStore()
    with pytest.raises(NotFoundError):
        store.get("0" * 64)
    with pytest.raises(LookupError):
        store.get("0" * 64)
    with pytest.raises(IntegrityError):
        store.get("../../keys/ed25519.key")


def test_flipped_byte_in_stored_json(evidence: Any) -> None:
    store = AttestationStore()
    att = mint(evidence.body, evidence.signer)
    path = store.put(att)
    raw = path.read_bytes()
    offset = raw.index(b'"run-1"') + 5  # inside the run id, still valid JSON
    os.chmod(path, 0o644)
    path.write_bytes(raw[:offset] + bytes([raw[offset] ^ 0x01]) + raw[offset + 1 :])
    with pytest.raises(IntegrityError, match="does not hold"):
        store.get(att.id)
    tampered = Attestation.model_validate_json(path.read_bytes())
    found = {v.kind for v in verify_attestation(tampered)}
    assert found == {"attestation_id", "attestation_signature"}
    path.write_bytes(b"{not json")
    with pytest.raises(IntegrityError, match="malformed"):
        store.get(att.id)


@pytest.mark.parametrize("plant", ["fifo", "link"])
def test_a_fifo_or_link_in_place_of_an_attestation_is_refused_never_waited_on(
        evidence: Any, tmp_path: Path, plant: str) -> None:
    """``get`` opened the file with a plain ``open``: a FIFO planted under an attestation's
    name (whoever can write the home) hung ``choir audit`` and ``choir gate`` for good, and
    a link was followed (a review's finding; the FIFO case hung the old code). It is read
    like every other record now: no link followed, a regular file or an IntegrityError."""
    import threading

    store = AttestationStore()
    att = mint(evidence.body, evidence.signer)
    path = store.put(att)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(path.read_bytes())
    path.chmod(0o644)
    path.unlink()
    if plant == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(elsewhere)
    got: list[object] = []

    def read() -> None:
        try:
            got.append(store.get(att.id))
        except IntegrityError as exc:
            got.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # unblock the old code's open() so the test process can end
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
        pytest.fail("reading the attestation waited on a FIFO")
    assert len(got) == 1 and isinstance(got[0], IntegrityError), got
