"""Review 23a, F1 end to end: a ``--sandbox local`` step runs as the user who runs Choir; it
copied the broker's socket out of the ``choir`` process above it (``pidfd_getfd``) and had
the broker sign a forged PASS. Cold and through ``choir serve``'s worker (a fork of the
service), every descriptor of every ``choir`` ancestor is now refused to it.
The unit test (``tests/unit/trusted/test_main_not_dumpable.py``) tries each level."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.serving import CHOIR, start_service, stop_service

STEP = r'''
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
seen, taken = [], []
pid = os.getppid()
while pid > 1:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        if b"choir" in fh.read():
            seen.append(pid)
            pidfd = os.pidfd_open(pid)
            for fd in range(64):
                if libc.syscall(438, pidfd, fd, 0) >= 0:  # pidfd_getfd
                    taken.append([pid, fd])
                elif ctypes.get_errno() != errno.EPERM:
                    break  # EBADF: past its last descriptor
            os.close(pidfd)
    with open(f"/proc/{pid}/stat") as fh:
        pid = int(fh.read().rsplit(")", 1)[1].split()[1])
with open(sys.argv[1], "w") as fh:
    json.dump({"seen": seen, "taken": taken}, fh)
'''


def _repo(tmp_path: Path) -> tuple[Path, Path]:
    repo, loot = tmp_path / "repo", tmp_path / "loot.json"
    repo.mkdir()
    (repo / "steal.py").write_text(STEP)
    (repo / "choir.yaml").write_text(
        f"verification:\n  steps:\n    - {{name: steal, command: python3 steal.py {loot}}}\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo, loot


def _verify(repo: Path, serve: str) -> subprocess.CompletedProcess[str]:
    # a cold process, never tests.forked's: the step looks for `choir` in its ancestors' argv
    return subprocess.run([*CHOIR, "verify", "--repo", str(repo), "--sandbox", "local",
                           "--mood", "CALM"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, CHOIR_SERVE=serve))


def _nothing_taken(loot: Path) -> None:
    got = json.loads(loot.read_text())
    assert got["seen"], got  # the step did find the choir process(es) above it
    assert got["taken"] == [], got


def test_a_local_step_takes_no_descriptor_from_a_cold_verify(tmp_path: Path,
                                                            choir_home: Path) -> None:
    repo, loot = _repo(tmp_path)
    proc = _verify(repo, "off")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    _nothing_taken(loot)


@pytest.mark.slow
def test_a_local_step_takes_no_descriptor_from_the_serve_worker(tmp_path: Path,
                                                               choir_home: Path) -> None:
    repo, loot = _repo(tmp_path)
    pid = start_service()
    try:
        proc = _verify(repo, "require")
    finally:
        stop_service(pid)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    _nothing_taken(loot)
