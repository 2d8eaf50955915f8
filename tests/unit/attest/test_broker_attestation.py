"""What the broker checks of an attestation body before it signs it."""

from __future__ import annotations

from typing import Any

import pytest

from choir.attest import mint, verify_attestation
from choir.exceptions import SigningRefused
from choir.trusted import signer


def test_an_attestation_citing_objects_absent_from_the_store_is_refused(evidence: Any) -> None:
    """A body is signed only when its report and manifest are stored under those hashes."""
    assert not verify_attestation(mint(evidence.body, signer()), artifacts=evidence.store)
    evidence.store.path_of(evidence.body.manifest_hash).unlink()
    with pytest.raises(SigningRefused, match="manifest .* is not in the artifact store"):
        mint(evidence.body, signer())
