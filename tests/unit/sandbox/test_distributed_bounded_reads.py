"""The coordinator reads a worker's answer within a bound (review 23c): what a frame says it
holds is counted before it is allocated, and a frame that names its own compression is
decompressed only up to what is left of the bound; an answer for another run than the one
asked for is refused before anything is stored."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from choir.distributed import fanout
from choir.distributed.fanout import ReadRefused, _bounded_decompress
from choir.distributed.remote_run import RemoteRun, land
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.target import resolve_target
from choir.exceptions import IntegrityError
from choir.models import StepSpec, VerifierKind, VerifierSpec
from choir.sandbox import get_sandbox
from choir.verification.pipeline import run_verifier

SPEC = VerifierSpec(name="echo", kind=VerifierKind.SMOKE,
                    steps=(StepSpec(name="say", command="echo evidence"),))


def _never(data: object) -> object:
    raise AssertionError("decompressed in full before its size was checked")


def _within(nbytes: int) -> object:
    """As inside a read of a Dask comm with ``nbytes`` left of its bound."""
    return fanout._LEFT.set([nbytes])


@pytest.mark.parametrize("codec", ["zlib", "zstd"])
def test_a_compression_bomb_stops_at_the_bound(codec: str) -> None:
    plain = bytes(32 << 20)
    if codec == "zlib":
        packed = zlib.compress(plain)
    else:
        zstandard = pytest.importorskip("zstandard")
        packed = zstandard.ZstdCompressor().compress(plain)
    assert len(packed) < 1 << 20
    token = _within(1 << 20)
    try:
        with pytest.raises(ReadRefused, match="more than"):
            _bounded_decompress(codec, _never)(packed)
    finally:
        fanout._LEFT.reset(token)


@pytest.mark.parametrize("codec", ["zlib", "zstd"])
def test_what_fits_is_decompressed_and_counted(codec: str) -> None:
    plain = b"evidence\n" * 1000
    if codec == "zlib":
        packed = zlib.compress(plain)
    else:
        zstandard = pytest.importorskip("zstandard")
        packed = zstandard.ZstdCompressor().compress(plain)
    left = [1 << 20]
    token = fanout._LEFT.set(left)
    try:
        assert bytes(_bounded_decompress(codec, _never)(packed)) == plain
    finally:
        fanout._LEFT.reset(token)
    assert left == [(1 << 20) - len(plain)]


def test_a_size_announced_past_the_bound_is_refused_before_decompressing() -> None:
    token = _within(1 << 20)
    try:
        with pytest.raises(ReadRefused):
            _bounded_decompress("lz4", _never)((64 << 20).to_bytes(4, "little") + b"x")
        with pytest.raises(ReadRefused):  # snappy: a varint of 64 MiB
            _bounded_decompress("snappy", _never)(b"\x80\x80\x80\x20x")
        with pytest.raises(ReadRefused, match="cannot decompress within a bound"):
            _bounded_decompress("brotli", _never)(b"x")
    finally:
        fanout._LEFT.reset(token)


def test_the_bound_is_the_answers_awaited_and_a_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout, "_AWAITED", {"choir-a": 5 << 20, "choir-b": 7 << 20})
    assert fanout._read_bound() == fanout.READ_MARGIN_BYTES + (12 << 20)
    token = _within(10)
    try:
        fanout._take(10)
        with pytest.raises(ReadRefused):
            fanout._take(1)
    finally:
        fanout._LEFT.reset(token)


def test_an_answer_for_another_run_id_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    """F3 (23c): a worker asked for ``r-1`` answered with a run sealed as ``r-2`` (a sibling
    replica's id); it landed under ``r-2``."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    worker_store = ArtifactStore(tmp_path / "worker-store")
    result = run_verifier(SPEC, repo=repo, sandbox=get_sandbox("local"), store=worker_store,
                          run_id="r-2", target=resolve_target(repo))
    base = worker_store.run_dir("r-2")
    remote = RemoteRun(run_id="r-2", manifest_json=(base / "manifest.json").read_bytes(),
                       manifest_hash=result.manifest_hash,
                       files={rel: (base / rel).read_bytes() for rel in result.manifest.files})
    store = ArtifactStore(tmp_path / "coordinator")
    with pytest.raises(IntegrityError, match="not the run asked for"):
        land(remote, store=store, spec=SPEC, target=resolve_target(repo), run_id="r-1")
    assert store.sealed("r-1") is None and store.sealed("r-2") is None
    assert not (store.root / "runs").exists() or not any((store.root / "runs").iterdir())
