"""``channel``: a broker of its own for a fork of the client (``choir serve``'s workers).

The copy signs with the same key under the same checks, answers after the channel it was
asked on closes (a request outlives a kill of the service), and exits when its own closes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from choir._core.canonical import canonical_json
from choir.attest import verify_signature
from choir.exceptions import SigningRefused
from choir.trusted import adopt, signer
from choir.trusted.client import BrokerSigner

HEAD = {"type": "choir.ahdb-head/v1", "seq": 1, "head": "b" * 64}


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return True
        except OSError:
            return True
        time.sleep(0.02)
    return False


def test_a_channel_signs_with_the_same_key_and_outlives_its_parent(choir_home: Path) -> None:
    main = signer()
    pid, sock = main.channel()
    assert pid not in (main.pid, os.getpid())
    copy = BrokerSigner(choir_home, pid, sock)
    assert copy.key_id == main.key_id
    data = canonical_json(HEAD)
    assert verify_signature(main.public_key, data, copy.sign(data))
    with pytest.raises(SigningRefused):
        copy.sign(b"raw bytes")  # the same checks
    main.close()  # the broker it came from exits ...
    assert _gone(main.pid)
    assert verify_signature(copy.public_key, data, copy.sign(data))  # ... the copy answers
    copy.close()
    assert _gone(pid)  # and exits with its own channel


def test_a_fork_adopts_its_channel_and_signs_through_it(choir_home: Path) -> None:
    main = signer()
    pid, sock = main.channel()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (reported through the pipe)
        code = 1
        try:
            adopt(choir_home, pid, sock)
            mine = signer(choir_home)
            data = canonical_json(HEAD)
            ok = mine.pid == pid and verify_signature(main.public_key, data, mine.sign(data))
            os.write(write, b"ok" if ok else b"no")
            code = 0
        finally:
            os._exit(code)
    sock.close()
    os.close(write)
    assert os.read(read, 2) == b"ok"
    os.close(read)
    os.waitpid(child, 0)
    assert main.usable()  # the parent's own channel was left alone
    assert _gone(pid)  # the fork's exit closed the copy's channel
