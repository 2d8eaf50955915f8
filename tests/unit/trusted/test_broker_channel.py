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


def test_a_copy_builds_no_validator_on_a_requests_path(tmp_path: Path) -> None:
    """The models' validators are built at first use (``defer_build``): the broker builds
    them before it forks its first copy, so no copy (one per request of ``choir serve``)
    builds the body's validator in the request's attestation (10-14 ms of a warm request's
    mint, measured, before). Run in a fresh interpreter: a test process may hold them built."""
    import subprocess
    import sys
    import textwrap

    log = tmp_path / "built"
    script = textwrap.dedent(f"""\
        import os
        from pydantic._internal import _model_construction as made
        complete = made.complete_model_class
        def counted(cls, *args, **kwargs):
            with open({str(log)!r}, "a") as fh:
                fh.write(f"{{os.getpid()}} {{cls.__name__}}\\n")
            return complete(cls, *args, **kwargs)
        made.complete_model_class = counted
        from choir._core.canonical import canonical_json
        from choir.exceptions import SigningRefused
        from choir.trusted import signer
        from choir.trusted.client import BrokerSigner
        from pathlib import Path
        main = signer()
        pid, sock = main.channel()
        copy = BrokerSigner(Path(os.environ["CHOIR_HOME"]), pid, sock)
        try:  # an attestation's type: the check validates the body, then refuses it
            copy.sign(canonical_json({{"type": "choir.attestation/v1"}}))
        except SigningRefused:
            pass
        print(pid)
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    copy_pid = proc.stdout.split()[-1]
    built = log.read_text().splitlines() if log.exists() else []
    assert not [line for line in built if line.split()[0] == copy_pid], built
    assert any("AttestationBody" in line for line in built), built  # built, by the broker
