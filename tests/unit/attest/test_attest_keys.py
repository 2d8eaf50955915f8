"""The signing key: created once, private, and the same key when processes race."""

from __future__ import annotations

import base64
import stat
import subprocess
import sys
import time
from pathlib import Path

import blake3
import pytest

from choir.attest import Signer, load_signer, trusted_key_ids, verify_signature
from choir.exceptions import IntegrityError


def test_key_created_private_and_reused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    signer = load_signer(home)
    keys = home / "keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / "ed25519.key").stat().st_mode) == 0o600
    assert (keys / "ed25519.key").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert (keys / "ed25519.pub").read_text().strip() == signer.public_key
    raw = base64.b64decode(signer.public_key)
    assert len(raw) == 32
    assert signer.key_id == blake3.blake3(raw).hexdigest()[:32]
    assert load_signer(home).key_id == signer.key_id
    assert sorted(p.name for p in keys.iterdir()) == ["ed25519.key", "ed25519.pub"]


def test_default_home_is_choir_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "h"))
    signer = load_signer()
    assert (tmp_path / "h" / "keys" / "ed25519.key").exists()
    assert signer.key_id == load_signer(tmp_path / "h").key_id


def test_sign_and_verify(tmp_path: Path) -> None:
    signer = load_signer(tmp_path)
    payload = b'{"type":"choir.test-record/v1"}'
    sig = signer.sign(payload)
    assert verify_signature(signer.public_key, payload, sig)
    assert not verify_signature(signer.public_key, payload.upper(), sig)
    assert not verify_signature(Signer.generate().public_key, payload, sig)
    assert not verify_signature("%%%", payload, sig)
    assert not verify_signature(signer.public_key, payload, "AAAA")


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    load_signer(tmp_path)
    (tmp_path / "keys" / "ed25519.key").chmod(0o644)
    with pytest.raises(IntegrityError, match="chmod 600"):
        load_signer(tmp_path)


def test_corrupt_key_is_refused(tmp_path: Path) -> None:
    load_signer(tmp_path)
    key = tmp_path / "keys" / "ed25519.key"
    key.write_bytes(b"garbage")
    with pytest.raises(IntegrityError, match="not a readable"):
        load_signer(tmp_path)


RACE = """
import sys, time
from pathlib import Path
from choir.attest import load_signer
gate = Path(sys.argv[2])
while not gate.exists():
    time.sleep(0.001)
print(load_signer(Path(sys.argv[1])).key_id)
"""


def test_processes_racing_to_create_the_key_end_with_one(tmp_path: Path) -> None:
    home, gate = tmp_path / "home", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(home), str(gate)],
            stdout=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    time.sleep(0.5)  # let every child import and wait at the gate
    gate.touch()
    ids = {p.communicate(timeout=30)[0].decode().strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(ids) == 1
    assert ids == {load_signer(home).key_id}
    assert sorted(p.name for p in (home / "keys").iterdir()) == ["ed25519.key", "ed25519.pub"]


def test_a_pub_dropped_in_keys_trusted_is_not_trusted(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHOIR_TRUSTED_KEYS", raising=False)
    mine = load_signer(tmp_path)
    intruder = Signer.generate()
    trusted = tmp_path / "keys" / "trusted"
    trusted.mkdir()
    (trusted / "ci.pub").write_text(intruder.public_key + "\n")
    assert trusted_key_ids(tmp_path) == {mine.key_id}  # pinned on first use, nothing else
