"""Review 24a, F3: a ``--sandbox local`` step (same uid as main) renames ``$CHOIR_HOME`` away
(main's mask over ``keys/`` follows it) and makes a new home at the same path holding a key
it generated and kept. The broker, which sees the host's files and reloaded the key file by
path whenever it changed (``choir keys rotate``), loaded the planted key as a rotation and,
after one ``stale`` reply, signed everything under the step's key. Now the broker reads the
key only inside the folder it pinned at start and refuses to sign once ``home/keys`` is
another folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from choir.attest import verify_signature
from choir.exceptions import IntegrityError
from choir.trusted.broker import spawn
from choir.trusted.client import BrokerSigner
from choir.trusted.keyfile import Signer, load_key, rotate_key


def _body(n: int) -> bytes:
    return b'{"n":%d,"type":"choir.probe/v1"}' % n


def _plant(home: Path) -> Signer:
    """What the step does: move the home away, make another at its path with its own key."""
    os.rename(home, home.with_name("home.old"))
    return load_key(home)


def _attempts(client: BrokerSigner, planted: Signer) -> list[str]:
    """Sign twice, asking the key id again after each refusal (as ``trusted.signer`` does);
    no signature may verify under the planted key, nor any key id be its."""
    seen = []
    for n in (2, 3):
        try:
            signature = client.sign(_body(n))
        except IntegrityError as err:
            seen.append(str(err))
        else:
            assert not verify_signature(planted.public_key, _body(n), signature)
            seen.append("signed")
        try:
            assert client.key_id != planted.key_id
        except IntegrityError as err:
            seen.append(str(err))
    return seen


CONFINED = r'''
import json, os, sys
from pathlib import Path
from choir import trusted
from choir.trusted.keyfile import load_key
home = Path(sys.argv[1])
out = {"level": trusted.separate(home)}
held = trusted.signer(home)
out["before"] = held.key_id
os.rename(home, home.with_name("home.old"))  # the step, with main's uid
out["planted"] = load_key(home).key_id
for n in (2, 3):
    try:
        out[f"sign{n}"] = trusted.signer(home).sign(b'{"n":%d,"type":"choir.probe/v1"}' % n)
    except Exception as exc:
        out[f"sign{n}"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out), flush=True)
'''


def test_a_confined_command_whose_home_a_step_replaced_stops_signing(tmp_path: Path) -> None:
    """The reviewer's reproduction: ``trusted.signer`` says why, and signs nothing."""
    home = tmp_path / "home"
    real = load_key(home).key_id
    run = subprocess.run([sys.executable, "-c", CONFINED, str(home)], capture_output=True,
                         text=True, cwd="/", timeout=60, env=dict(os.environ, CHOIR_HOME=str(home)))
    out = json.loads(run.stdout)
    if out["level"] == "process":
        pytest.skip("no confinement here: main reads the key folder itself")
    assert out["before"] == real != out["planted"]
    for n in (2, 3):
        assert out[f"sign{n}"].startswith("IntegrityError"), out
        assert "no longer the key folder" in out[f"sign{n}"] and "run the command again" in \
            out[f"sign{n}"], out


def _journal(keys: Path) -> list[str]:
    log = keys / "signed.log"
    return [json.loads(line)["key_id"] for line in log.read_text().splitlines()] \
        if log.exists() else []


def test_a_home_replaced_under_a_running_broker_never_lends_it_its_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    real = load_key(home)
    client = BrokerSigner(home, *spawn(home))
    try:
        assert client.key_id == real.key_id
        assert verify_signature(real.public_key, _body(1), client.sign(_body(1)))
        planted = _plant(home)
        seen = _attempts(client, planted)
        assert all("no longer the key folder" in s for s in seen), seen
        assert "run the command again" in seen[0]
        assert client.usable(same_key=False) is False  # ``hello`` announces no key either
    finally:
        client.close()
    assert _journal(tmp_path / "home.old" / "keys") == [real.key_id]
    assert _journal(home / "keys") == []


def test_a_home_replaced_before_the_first_request_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    load_key(home)
    client = BrokerSigner(home, *spawn(home))  # pinned at start, before any step ran
    try:
        planted = _plant(home)
        seen = _attempts(client, planted)
        assert "no longer the key folder" in seen[0] and "signed" not in seen, seen
    finally:
        client.close()  # (a client whose ``hello`` fails closes itself at once)


def test_a_rotation_in_the_pinned_folder_is_still_loaded(tmp_path: Path) -> None:
    home = tmp_path / "home"
    client = BrokerSigner(home, *spawn(home))  # no home yet: made and pinned at first use
    try:
        old = client.key_id
        _, fresh = rotate_key(home)
        try:
            client.sign(_body(1))
            raise AssertionError("a body built for the old key id was signed")
        except IntegrityError as err:
            assert "rotated" in str(err)
        assert client.key_id == fresh.key_id != old
        assert verify_signature(fresh.public_key, _body(2), client.sign(_body(2)))
    finally:
        client.close()
    assert _journal(home / "keys") == [fresh.key_id]
