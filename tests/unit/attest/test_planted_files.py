"""Files planted in the home are named, never waited on or read without bound (review 21, F2).

A FIFO where the trust pin, the revoked list, the heads log or ``keys/ed25519.pub`` should be
hung ``choir audit`` and ``choir gate`` (the last one the broker, at start, and its client
with it); a link to ``/dev/zero`` ran them out of memory. Each case runs in a child process
with a deadline, so code that still blocks fails the test instead of hanging the suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from choir.exceptions import IntegrityError


def _plant(path: Path, how: str) -> None:
    path.unlink(missing_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def _run(home: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter on ``home``, under a 1 GiB address-space limit."""
    env = {**os.environ, "CHOIR_HOME": str(home), "CHOIR_ARTIFACT_DIR": str(home / "art")}
    env.pop("CHOIR_TRUSTED_KEYS", None)
    env.pop("CHOIR_REVOKED_KEYS", None)
    prelude = "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=20)


@pytest.fixture(scope="module")
def made_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home with its key made and pinned (as after a first ``choir verify``), made once."""
    base = tmp_path_factory.mktemp("made") / "home"
    base.mkdir()
    done = _run(base, "from choir.attest import trust_root; print(trust_root().keys)")
    assert done.returncode == 0, done.stderr[-2000:]
    return base


@pytest.fixture
def home(made_home: Path, tmp_path: Path) -> Path:
    """This test's copy of that home (``cp -a``: the key's mode kept), which it plants in."""
    base = tmp_path / "home"
    subprocess.run(["cp", "-a", str(made_home), str(base)], check=True)
    return base


@pytest.mark.parametrize("how", ["fifo", "zero"])
@pytest.mark.parametrize("name", ["trusted_keys", "revoked_keys"])
def test_a_planted_key_list_is_a_config_error_naming_it(home: Path, name: str,
                                                        how: str) -> None:
    _plant(home / name, how)
    done = _run(home, """
        from choir.attest import trust_root
        from choir.exceptions import ConfigError
        try:
            trust_root()
        except ConfigError as exc:
            print("refused:", exc)
        """)
    assert done.returncode == 0 and "refused:" in done.stdout, done.stderr[-2000:]
    assert name in done.stdout, done.stdout
    assert ("symbolic link" if how == "zero" else "not a regular file") in done.stdout


@pytest.mark.parametrize("how", ["fifo", "zero"])
def test_a_planted_public_key_file_is_written_afresh(home: Path, how: str) -> None:
    pub = home / "keys" / "ed25519.pub"
    _plant(pub, how)
    done = _run(home, "from choir.trusted import signer; print(signer().public_key)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert pub.is_file() and not pub.is_symlink()
    assert pub.read_text().strip() == done.stdout.strip()


def test_a_planted_private_key_file_is_refused_not_waited_on(home: Path) -> None:
    _plant(home / "keys" / "ed25519.key", "fifo")
    done = _run(home, """
        from choir.exceptions import IntegrityError
        from choir.trusted import signer
        try:
            signer()
        except IntegrityError as exc:
            print("refused:", exc)
        """)
    assert done.returncode == 0 and "not a regular file" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("how", ["fifo", "zero"])
def test_a_planted_heads_log_is_named(tmp_path: Path, how: str) -> None:
    _plant(tmp_path / "ahdb.sqlite.heads", how)
    done = _run(tmp_path, f"""
        from pathlib import Path
        from choir.ahdb.heads import read_heads
        print(list(read_heads(Path({str(tmp_path / 'ahdb.sqlite.heads')!r}))))
        """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the file cannot be read" in done.stdout


def test_an_overlong_heads_line_is_not_held_whole(tmp_path: Path) -> None:
    from choir.ahdb.heads import MAX_LINE, read_heads

    path = tmp_path / "ahdb.sqlite.heads"
    path.write_bytes(b"x" * (MAX_LINE * 3) + b"\n" + b'{"seq": 1}\n')
    found = list(read_heads(path))
    assert found == ["line 1 is torn (no line end)", "line 2 is not a head record"]


def test_the_client_gives_up_on_a_broker_that_does_not_answer(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever else blocks the broker, its client's first question has a deadline, and
    the stuck broker is killed and reaped, not waited on."""
    from choir.trusted import client

    monkeypatch.setattr(client, "HELLO_DEADLINE_S", 0.5)
    ours, theirs = socket.socketpair()
    stuck = subprocess.Popen(["sleep", "60"])
    signing = client.BrokerSigner(home, stuck.pid, ours)
    began = time.monotonic()
    with pytest.raises(IntegrityError, match="did not answer within 0.5 s"):
        signing.key_id  # noqa: B018
    assert time.monotonic() - began < 5
    assert stuck.poll() is not None  # killed and reaped
    signing.close()
    theirs.close()
