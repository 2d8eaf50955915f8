"""The broker signs only typed, bounded Choir objects, and never outlives its parent."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from choir._core.canonical import canonical_json
from choir.attest import verify_signature
from choir.exceptions import SigningRefused
from choir.trusted import signer
from choir.trusted.protocol import MAX_FRAME, MAX_SIGNED

HEAD = {"type": "choir.ahdb-head/v1", "seq": 3, "head": "a" * 64}


@pytest.mark.parametrize("data, why", [
    (b"\x00\x01 raw bytes", "not JSON"),
    (b"[1,2]", "not a JSON object"),
    (b'{"type": "choir.x/v1"}', "not canonical"),
    (b'{"type":"ssh-userauth"}', "not a Choir object"),
    (b'{"head":"x","seq":3,"type":"choir.ahdb-head/v1"}', "a head is exactly"),
    (canonical_json({**HEAD, "seq": -1}), "a head is exactly"),
    (canonical_json({**HEAD, "extra": 1}), "a head is exactly"),
    (b"DSSEv1 3 foo 2 {}", "one in-toto JSON payload"),
    (canonical_json({"type": "choir.attestation/v1", "run_id": "r"}), "not a valid attestation"),
    (b'{"type":"choir.x/v1","pad":"' + b"x" * MAX_SIGNED + b'"}', "more than"),
])
def test_the_broker_refuses_what_is_not_a_choir_object(data: bytes, why: str) -> None:
    with pytest.raises(SigningRefused, match=why):
        signer().sign(data)


def test_heads_and_records_are_signed(choir_home: Path) -> None:
    s = signer()
    for data in (canonical_json(HEAD), b'{"type":"choir.session/v1","x":1}'):
        assert verify_signature(s.public_key, data, s.sign(data))


def test_a_malformed_or_oversized_frame_gets_no_signature(choir_home: Path) -> None:
    s = signer()
    raw = s._sock
    assert raw is not None
    raw.settimeout(10)
    raw.sendall(struct.pack(">I", 10) + b'{"op":"x"}')  # a frame, but no request
    assert b"not a broker request" in raw.recv(4096)
    raw.sendall(struct.pack(">I", MAX_FRAME + 1))  # never read: the broker hangs up
    assert raw.recv(4096) == b""
    s.close()
    garbage = signer()  # a new broker: the old one is gone
    assert garbage._sock is not None and garbage.pid != s.pid
    garbage._sock.sendall(struct.pack(">I", 5) + b"{nope")  # not JSON: hang up
    assert garbage._sock.recv(4096) == b""


CHILD = """
import sys, time
from choir.trusted import signer
print(signer().pid, flush=True)
time.sleep(60)
"""


def test_the_broker_dies_with_its_parent(choir_home: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    broker = int(proc.stdout.readline())
    os.kill(broker, 0)  # alive while the parent is
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(broker, 0)
        except ProcessLookupError:
            return  # exited and reaped by init
        with open(f"/proc/{broker}/stat") as fh:
            if fh.read().split(") ")[1].startswith("Z"):
                return  # exited; a zombie until its new parent reaps it
        time.sleep(0.05)
    pytest.fail(f"broker {broker} outlived its parent")


def test_a_forked_child_gets_its_own_broker(choir_home: Path) -> None:
    parent = signer()
    read, write = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through the socket)
        try:
            child = signer()
            write.sendall(f"{child.pid} {child.key_id}".encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    child_pid, key_id = read.recv(200).decode().split()
    read.close()
    write.close()
    assert int(child_pid) != parent.pid and key_id == parent.key_id


def test_every_signature_is_journaled_where_the_main_process_cannot_see(
        choir_home: Path) -> None:
    import json

    from choir._core.canonical import blake3_hex

    s = signer()
    head = canonical_json(HEAD)
    s.sign(head)
    with pytest.raises(SigningRefused):
        s.sign(b"not signed, not journaled")
    lines = (choir_home / "keys" / "signed.log").read_text().splitlines()
    assert [(e["kind"], e["blake3"], e["key_id"]) for e in map(json.loads, lines)] == [
        ("head", blake3_hex(head), s.key_id)]
