"""The coordinator reads a worker's answer within a bound (review 23c): what a frame says it
holds is counted before it is allocated, and a frame that names its own compression is
decompressed only up to what is left of the bound."""

from __future__ import annotations

import zlib

import pytest

from choir.distributed import fanout
from choir.distributed.fanout import ReadRefused, _bounded_decompress


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
