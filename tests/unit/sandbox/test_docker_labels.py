"""Who owns a docker container, and when it is a leftover: pure label logic, no engine."""

from __future__ import annotations

import os
import subprocess
import time

from choir.sandbox.docker import (
    EXPIRES,
    LABEL,
    OWNER_HOST,
    OWNER_PID,
    OWNER_START,
    host_identity,
    is_leftover,
    process_start,
    run_labels,
)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_owner_identity_survives_pid_reuse() -> None:
    """Same PID, other start time: a different process, so the owner counts as gone."""
    labels = run_labels(time.time(), 60)
    host = host_identity()
    assert not is_leftover(labels, now=time.time(), host=host)
    assert is_leftover({**labels, OWNER_START: "1"}, now=time.time(), host=host)
    assert process_start(os.getpid()) == labels[OWNER_START]
    assert process_start(dead_pid()) is None


def test_a_dead_owner_makes_a_leftover_and_only_on_this_host() -> None:
    labels = {**run_labels(time.time(), 60), OWNER_PID: str(dead_pid())}
    assert is_leftover(labels, now=time.time(), host=host_identity())
    # another machine's process: its PID means nothing here, only its expiry counts
    assert not is_leftover(labels, now=time.time(), host="elsewhere/pid:[1]")
    assert is_leftover(labels, now=float(labels[EXPIRES]) + 1, host="elsewhere/pid:[1]")


def test_unparseable_or_missing_owner_labels_are_never_leftovers() -> None:
    late = time.time() + 10**9
    host = host_identity()
    assert not is_leftover({}, now=late, host=host)
    assert not is_leftover({LABEL: "1"}, now=late, host=host)  # an older Choir's container
    assert not is_leftover({"other": "x", OWNER_PID: "1", EXPIRES: "0"}, now=late, host=host)
    labels = {**run_labels(time.time(), 60), EXPIRES: "garbage", OWNER_PID: str(dead_pid())}
    assert not is_leftover(labels, now=late, host=host)


def test_expiry_covers_the_timeout_and_the_log_drain() -> None:
    now = time.time()
    labels = run_labels(now, 600)
    assert float(labels[EXPIRES]) >= now + 600 + 600  # timeout, then up to max(60, t) drain
    assert labels[OWNER_HOST] == host_identity()
    assert labels[OWNER_START] == process_start(os.getpid())
