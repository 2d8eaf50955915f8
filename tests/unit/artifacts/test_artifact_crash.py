"""Faults across processes: a writer SIGKILLed mid-ingest, and two writers racing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import blake3
import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError
from choir.verification.session import SEAL
from tests.memory import PEAK_RSS

INGEST = """
import sys
from pathlib import Path
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError
print(ArtifactStore(Path(sys.argv[1])).ingest_stream(sys.stdin.buffer), flush=True)
"""


def _child(root: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", INGEST, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def test_sigkill_mid_ingest_leaves_no_object_and_gc_cleans(tmp_path: Path) -> None:
    root = tmp_path / "art"
    child = _child(root)
    assert child.stdin is not None
    tmp_dir = root / "tmp"
    deadline = time.monotonic() + 20
    written = 0
    # Feed until the child has demonstrably written part of the object to its temp file.
    while time.monotonic() < deadline:
        child.stdin.write(b"z" * (1 << 20))
        child.stdin.flush()
        written += 1 << 20
        partial = list(tmp_dir.iterdir()) if tmp_dir.exists() else []
        if partial and partial[0].stat().st_size > 0:
            break
    else:
        raise AssertionError("child never started writing")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdin.close()
    assert child.stdout is not None
    child.stdout.close()

    store = ArtifactStore(root)
    assert list(store.iter_objects()) == []  # nothing partial became visible
    assert len(list(tmp_dir.iterdir())) == 1
    assert not store.exists(blake3.blake3(b"z" * written).hexdigest())
    assert store.gc_tmp() == 1  # the writer's pid is dead: stale at once
    assert list(tmp_dir.iterdir()) == []


def test_gc_tmp_spares_a_live_writer(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "art")
    with store.writer() as w:
        w.write(b"in progress")
        assert store.gc_tmp() == 0  # our own pid is alive and the file is fresh
    assert w.digest is not None and store.verify(w.digest)
    with pytest.raises(IntegrityError, match="vanished"), store.writer() as w2:
        w2.write(b"old")
        assert store.gc_tmp(max_age_s=-1) == 1  # too old counts as stale, pid or not
    assert w2.digest is None
    assert list(store.iter_objects()) == [w.digest]
    (tmp_path / "art" / "tmp" / "foreign-name").write_bytes(b"")
    assert store.gc_tmp() == 1  # a name no writer of ours makes is always stale


def test_two_processes_ingesting_the_same_content(tmp_path: Path) -> None:
    root = tmp_path / "art"
    data = os.urandom(8 << 20)
    children = [_child(root) for _ in range(2)]
    for child in children:
        assert child.stdin is not None
    for offset in range(0, len(data), 1 << 20):
        for child in children:
            assert child.stdin is not None
            child.stdin.write(data[offset : offset + (1 << 20)])
    outputs = [child.communicate()[0].decode().strip() for child in children]
    assert all(child.returncode == 0 for child in children)
    expected = blake3.blake3(data).hexdigest()
    assert outputs == [expected, expected]
    store = ArtifactStore(root)
    assert list(store.iter_objects()) == [expected]
    assert store.verify(expected)
    assert list((root / "tmp").iterdir()) == []


MEMORY = PEAK_RSS + """
import sys
from pathlib import Path
from choir.evidence.artifacts import ArtifactStore
store = ArtifactStore(Path(sys.argv[1]))
before = peak_rss_kib()
digest = store.ingest_stream(sys.stdin.buffer)
after = peak_rss_kib()
print(digest, (after - before) // 1024)
"""


def test_ingest_memory_stays_flat_for_a_large_pipe(tmp_path: Path) -> None:
    size = 192 << 20
    producer = subprocess.Popen(["head", "-c", str(size), "/dev/zero"], stdout=subprocess.PIPE)
    consumer = subprocess.run(
        [sys.executable, "-c", MEMORY, str(tmp_path / "art")],
        stdin=producer.stdout,
        capture_output=True,
        check=True,
        timeout=120,
    )
    producer.wait()
    assert producer.stdout is not None
    producer.stdout.close()
    digest, grown_mib = consumer.stdout.decode().split()
    assert digest == blake3.blake3(bytes(size)).hexdigest()
    assert int(grown_mib) < 16  # one 1 MiB buffer, whatever the size


KILLED_AFTER_LINK = """
import os, signal, sys
from pathlib import Path
import choir.evidence.artifacts as artifacts
from choir.verification.session import write_session
from tests.unit.artifacts.test_artifact_runs import manifest

def die(_path):  # the manifest is linked into place; its temp is not yet removed
    os.kill(os.getpid(), signal.SIGKILL)

artifacts._fsync_dir = die
store = artifacts.ArtifactStore(Path(sys.argv[1]))
if sys.argv[2] == "run":
    store.write_manifest("r1", manifest("r1", {}))
else:
    write_session(store, "verify-20260101T000000-abcdef", {"run_id": "x"})
"""


@pytest.mark.parametrize("kind", ["run", "session"])
def test_sigkill_after_the_manifest_lands_leaves_nothing_in_the_run_folder(
        tmp_path: Path, kind: str) -> None:
    """``kill -9`` between a manifest's link and its temp's removal: the run folder holds
    the manifest alone (an extra file there fails ``choir audit``); the temp is in ``tmp/``,
    named for its dead writer, and ``gc_tmp`` removes it."""
    root = tmp_path / "art"
    child = subprocess.run([sys.executable, "-c", KILLED_AFTER_LINK, str(root), kind],
                           cwd=Path(__file__).parents[3], capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    folder = next((root / "runs").iterdir())
    # a session's seal is linked right behind its manifest, before the folder is synced
    names = ["manifest.json"] if kind == "run" else ["manifest.json", SEAL]
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)
    assert ArtifactStore(root).gc_tmp() == len(names)


KILLED_AT_FSYNC = """
import os, signal, sys
from pathlib import Path
import choir.evidence.artifacts as artifacts
from choir.verification.session import write_session

from choir.attest import load_signer

signer = load_signer()  # the key made and its broker started before anything is counted
real, calls, me = os.fsync, [], os.getpid()

def fsync(fd):  # the Nth fsync of this process's write never returns
    if os.getpid() == me:
        calls.append(fd)
        if len(calls) == int(sys.argv[2]):
            os.kill(me, signal.SIGKILL)
    real(fd)

os.fsync = fsync
write_session(artifacts.ArtifactStore(Path(sys.argv[1])), "verify-20260101T000000-abcdef",
              {"run_id": "x"}, signer)
print(len(calls))
"""


FSYNCS = 3  # the session's two temps, then its folder: a kill at each is tried


def test_a_session_record_is_written_with_exactly_the_fsyncs_the_kills_try(
        tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_AT_FSYNC, str(tmp_path / "art"), "0"],
                          cwd=Path(__file__).parents[3], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == [str(FSYNCS)]


@pytest.mark.parametrize("nth", range(1, FSYNCS + 1))
def test_a_session_killed_at_any_fsync_leaves_its_manifest_sealed_or_absent(
        tmp_path: Path, nth: int) -> None:
    """A ``choir verify`` killed while it writes its session record: the folder holds the
    manifest with its seal, or neither. Before, the manifest was linked and synced, then the
    seal signed, written and synced (four fsyncs): a kill at the 2nd or 3rd left a manifest
    without a seal, which fails every later ``choir audit`` (``session_seal``)."""
    root = tmp_path / "art"
    child = subprocess.run([sys.executable, "-c", KILLED_AT_FSYNC, str(root), str(nth)],
                           cwd=Path(__file__).parents[3], capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    folder = root / "runs" / "verify-20260101T000000-abcdef"
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    assert names in ([], ["manifest.json", SEAL]), (nth, names)
