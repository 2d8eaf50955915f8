"""Run folders: sealing evidence into the manifest, and the write-once manifest."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import blake3
import pytest

from choir._core.canonical import canonical_json
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError
from choir.models import Platform, RunManifest


def manifest(run_id: str, files: dict[str, str], status: str = "PASS") -> RunManifest:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return RunManifest(
        run_id=run_id,
        verifier="pipeline",
        status=status,  # type: ignore[arg-type]
        timestamp_start=now,
        timestamp_end=now,
        tree_hash="0" * 64,
        platform=Platform(os="linux", arch="x86_64", sandbox="local", isolation="none"),
        files=files,
    )


def test_seal_run_hashes_every_file_and_locks_them(store: ArtifactStore, tmp_path: Path) -> None:
    base = store.run_dir("r1")
    (base / "logs").mkdir(parents=True)
    (base / "logs" / "combined.log").write_bytes(b"all\n")
    (base / "logs" / "step-01-test.log").write_bytes(b"step\n")
    (base / "junit.xml").write_bytes(b"<testsuite/>")
    (base / "manifest.json").write_bytes(b"{}")
    outside = tmp_path / "secret"
    outside.write_bytes(b"host secret")
    os.symlink(outside, base / "leak")
    os.symlink(tmp_path, base / "dirleak")
    os.mkfifo(base / "fifo")

    files = store.seal_run("r1")

    assert files == {
        "junit.xml": blake3.blake3(b"<testsuite/>").hexdigest(),
        "logs/combined.log": blake3.blake3(b"all\n").hexdigest(),
        "logs/step-01-test.log": blake3.blake3(b"step\n").hexdigest(),
    }
    for rel, digest in files.items():
        assert stat.S_IMODE((base / rel).stat().st_mode) == 0o444
        assert store.verify(digest)
    assert not (base / "leak").exists() and not (base / "leak").is_symlink()
    assert not (base / "dirleak").is_symlink()
    assert not (base / "fifo").exists()
    assert outside.read_bytes() == b"host secret"


def test_write_manifest_is_canonical_atomic_and_write_once(store: ArtifactStore) -> None:
    m = manifest("r2", {"a.log": "1" * 64})
    digest = store.write_manifest("r2", m)
    path = store.run_dir("r2") / "manifest.json"
    assert path.read_bytes() == canonical_json(m)
    assert digest == blake3.blake3(canonical_json(m)).hexdigest()
    assert store.verify(digest)
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert RunManifest.model_validate_json(store.read_bytes(digest)) == m
    assert store.write_manifest("r2", m) == digest  # idempotent
    with pytest.raises(IntegrityError, match="different manifest"):
        store.write_manifest("r2", manifest("r2", {}, status="FAIL"))
    assert [p.name for p in store.run_dir("r2").iterdir()] == ["manifest.json"]
    assert list(store.iter_runs()) == ["r2"]
