"""Run leases: one process, on one machine, drives a run at a time.

With the embedded store the lease is an ``flock`` on ``$CHOIR_HOME/locks/RUN.lock``; with a
Postgres store (``choir.config.store_url``) it is a session-level advisory lock held on a dedicated
connection, so runners on different machines exclude each other too. Both are released by
the kernel or the server when the holder dies, even by ``kill -9``: a lock file would stay
behind, a lock bound to a descriptor or a connection cannot. A second runner refuses at
once (exit 2), or, with ``CHOIR_LEASE_WAIT_S`` seconds, waits for the lease and then drives
the run from its last checkpoint: a standby that takes over from a crashed runner.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from choir._core.canonical import blake3_hex
from choir.exceptions import ConfigError, UserError

WAIT_ENV = "CHOIR_LEASE_WAIT_S"
_POLL_S = 0.2


def lease_wait() -> float:
    """Seconds to wait for a held lease (``CHOIR_LEASE_WAIT_S``; default 0: refuse)."""
    raw = os.environ.get(WAIT_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86_400:
        raise ConfigError(f"{raw[:40]!r} is not a number of seconds", path=f"${WAIT_ENV}",
                          hint="0 (refuse at once) to 86400")
    return value


def lease_key(run_id: str) -> int:
    """A signed 64-bit advisory-lock key for ``run_id`` (blake3, so no two runs share one
    short of a 2^-64 collision; never the AHDB's write key, which has its own prefix)."""
    return int.from_bytes(bytes.fromhex(blake3_hex(f"choir-run/{run_id}".encode())[:16]),
                          "big", signed=True)


def _busy(run_id: str, waited: float) -> UserError:
    how = f" after waiting {waited:.0f} s" if waited else ""
    return UserError(f"run {run_id} is being driven by another process{how}; wait for it, "
                     f"or kill it and resume (set {WAIT_ENV}=SECONDS to wait for the lease)")


@contextlib.contextmanager
def file_lease(locks: Path, run_id: str, wait_s: float) -> Iterator[None]:
    locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(locks / f"{run_id}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise _busy(run_id, wait_s) from None
                time.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def pg_lease(url: str, run_id: str, wait_s: float) -> Iterator[None]:
    """Hold ``pg_advisory_lock(lease_key(run_id))`` on a connection of its own."""
    from choir.config.database import connect

    conn = connect(url)
    try:
        # the server notices a dead holder by its socket closing; TCP keepalives (set in
        # ``connect``, and the server's own tcp_keepalives_*) cover a vanished machine
        key, deadline = lease_key(run_id), time.monotonic() + wait_s
        while not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
            if time.monotonic() >= deadline:
                raise _busy(run_id, wait_s)
            time.sleep(_POLL_S)
        yield
    finally:
        conn.close()  # releases the lease with the session


@contextlib.contextmanager
def hold_lease(home: Path, run_id: str) -> Iterator[None]:
    """The configured store's lease on ``run_id`` for the duration of the block.

    Raises:
        UserError: another process holds it (after ``CHOIR_LEASE_WAIT_S``, if set).
        ConfigError: a bad store URL or wait value.
    """
    from choir.config.store_url import database_url

    url, wait_s = database_url(home), lease_wait()
    lease = pg_lease(url, run_id, wait_s) if url else file_lease(home / "locks", run_id, wait_s)
    with lease:
        yield
