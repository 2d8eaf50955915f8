"""Temps left by writers killed mid-write are cleared in passing, never a live writer's.

A ``choir verify`` killed -9 while it streams an artifact, writes a run file or stores an
attestation leaves its temp behind (``tmp/KIND-PID-HEX``, ``attestations/.tmp/a-PID-HEX``).
Nothing cleared them: a store grew by every big log a killed run was writing. Each verify
round now clears them beside its snapshot (``clear_stale_temps``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from choir.attest import AttestationStore, mint
from choir.attest.store import clear_stale_temps
from choir.evidence.artifacts import ArtifactStore


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def aged(path: Path, seconds: float, data: bytes = b"partial") -> Path:
    path.write_bytes(data)
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_stale_temps_go_and_live_or_young_ones_stay(choir_home: Path) -> None:
    tmp = ArtifactStore().root / "tmp"
    atts = AttestationStore().root / ".tmp"
    atts.mkdir(exist_ok=True)
    dead, me = dead_pid(), os.getpid()
    gone = [aged(tmp / f"w-{dead}-a1", 700),  # its writer is dead and it is 11 min old
            aged(tmp / f"m-{me}-b2", 2 * 86400),  # two days old: whoever named it
            aged(tmp / "planted-name", 700),  # no writer of ours names a temp so
            aged(atts / f"a-{dead}-c3", 700)]
    kept = [aged(tmp / f"w-{dead}-d4", 30),  # young: a writer in another pid namespace
            aged(tmp / f"m-{me}-e5", 7200)]  # a live writer, two hours into a long step
    folder = tmp / f"w-{dead}-f6"
    folder.mkdir()  # not a file: never removed
    assert clear_stale_temps() == len(gone)
    assert not any(p.exists() for p in gone)
    assert all(p.exists() for p in kept) and folder.is_dir()


KILLED_IN_PUT = """
import os, signal, sys
from choir.attest import AttestationStore, mint
from choir.models import Attestation

att = Attestation.model_validate_json(sys.stdin.buffer.read())
real, me = os.fsync, os.getpid()

def fsync(fd):  # the attestation's temp is written; the writer dies before its link
    if os.getpid() == me:
        os.kill(me, signal.SIGKILL)
    real(fd)

os.fsync = fsync
AttestationStore().put(att)
"""


def test_an_attestation_writer_killed_mid_put_leaves_its_temp_in_tmp_only(
        evidence: Any) -> None:
    """Before, the temp was a dotted file beside the attestations, which nothing cleared."""
    att = mint(evidence.body, evidence.signer)
    child = subprocess.run([sys.executable, "-c", KILLED_IN_PUT],
                           input=att.model_dump_json().encode(),
                           cwd=Path(__file__).parents[3], capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    store = AttestationStore()
    assert [p.name for p in store.root.iterdir()] == [".tmp"]  # nothing beside the ids
    [left] = list((store.root / ".tmp").iterdir())
    assert left.name.startswith("a-") and list(store.ids()) == []
    assert clear_stale_temps() == 0  # young: spared for its grace
    then = time.time() - 700
    os.utime(left, (then, then))
    assert clear_stale_temps() == 1 and not left.exists()
    assert store.put(att).is_file()  # and the attestation is stored as if nothing happened


def test_a_temp_folder_swapped_for_a_link_clears_nothing_through_it(
        choir_home: Path, tmp_path: Path) -> None:
    """Whoever can write the home can swap a temp folder for a link to the user's files:
    clearing temps by path followed it, and every verify deleted the files there that were
    ten minutes old. The folders are opened without following a link now."""
    papers = tmp_path / "papers"
    papers.mkdir()
    mine = [aged(papers / "thesis.tex", 700), aged(papers / f"w-{dead_pid()}-a1", 700)]
    for folder in (ArtifactStore().root / "tmp", choir_home / "attestations" / ".tmp"):
        folder.mkdir(parents=True, exist_ok=True)
        folder.rmdir()
        folder.symlink_to(papers)
    assert clear_stale_temps() == 0
    assert all(p.exists() for p in mine)


def test_a_temp_named_to_trip_the_pid_parse_is_cleared_not_raised(choir_home: Path) -> None:
    """Names whose pid part is no pid (a digit ``int`` refuses, one too large for ``kill``)
    failed every verify after they were planted; they are named otherwise, so stale."""
    tmp = ArtifactStore().root / "tmp"
    odd = [aged(tmp / "w-\u00b2-ab", 700), aged(tmp / f"w-{2 ** 70}-ab", 700),
           aged(tmp / "w-0-ab", 700)]
    young = aged(tmp / f"w-{2 ** 70}-cd", 30)
    assert clear_stale_temps() == len(odd)
    assert not any(p.exists() for p in odd) and young.exists()


def test_an_attestation_is_never_written_through_a_linked_temp_folder(
        tmp_path: Path, evidence: Any) -> None:
    """A temp folder swapped for a link would have the attestation's temp written there (a
    file in the user's folder, linked into the store): minting refuses it, saying why."""
    import pytest

    from choir.exceptions import IntegrityError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = AttestationStore()
    (store.root / ".tmp").mkdir(exist_ok=True)
    (store.root / ".tmp").rmdir()
    (store.root / ".tmp").symlink_to(elsewhere)
    with pytest.raises(IntegrityError, match="not a folder of the store"):
        store.put(mint(evidence.body, evidence.signer))
    assert list(elsewhere.iterdir()) == [] and list(store.ids()) == []


def test_an_artifact_is_never_written_through_a_linked_temp_folder(tmp_path: Path) -> None:
    import pytest

    from choir.exceptions import IntegrityError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = ArtifactStore(tmp_path / "store")
    (store.root / "tmp").rmdir()
    (store.root / "tmp").symlink_to(elsewhere)
    with pytest.raises(IntegrityError, match="not a folder of the store"):
        store.ingest_bytes(b"a log")
    assert list(elsewhere.iterdir()) == []
