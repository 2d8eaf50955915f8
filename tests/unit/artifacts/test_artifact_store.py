"""The artifact store: content addressing, dedupe, immutability, hostile ids and files."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choir._core.canonical import canonical_json, hash_json
from choir.evidence.artifacts import CHUNK, ArtifactStore, hash_file
from choir.exceptions import IntegrityError, UserError

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def b3(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def test_default_root_follows_choir_artifact_dir(store: ArtifactStore, tmp_path: Path) -> None:
    assert store.root == tmp_path / "art"
    assert {p.name for p in store.root.iterdir()} == {"objects", "runs", "tmp"}


@SETTINGS
@given(data=st.binary(max_size=5000), split=st.integers(min_value=1, max_value=700))
def test_ingest_equals_blake3_of_bytes(store: ArtifactStore, data: bytes, split: int) -> None:
    digest = store.ingest_stream(io.BufferedReader(io.BytesIO(data), buffer_size=split))
    assert digest == b3(data)
    assert store.read_bytes(digest) == data
    assert store.ingest_bytes(data) == digest
    with store.writer() as w:
        for i in range(0, len(data), split):
            w.write(data[i : i + split])
    assert w.digest == digest and w.size == len(data)


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
def test_ingest_sizes_around_chunk_boundaries(store: ArtifactStore, size: int) -> None:
    data = os.urandom(size)
    digest = store.ingest_stream(io.BytesIO(data))
    assert digest == b3(data)
    assert store.verify(digest)
    assert store.path_of(digest) == store.root / "objects" / digest[:2] / digest[2:]


def test_dedupe_and_objects_are_read_only(store: ArtifactStore) -> None:
    a = store.ingest_bytes(b"same bytes")
    b = store.ingest_bytes(b"same bytes")
    assert a == b
    assert list(store.iter_objects()) == [a]
    mode = stat.S_IMODE(store.path_of(a).stat().st_mode)
    assert mode == 0o444
    assert list((store.root / "tmp").iterdir()) == []


def test_writer_exception_stores_nothing(store: ArtifactStore) -> None:
    with pytest.raises(RuntimeError), store.writer() as w:
        w.write(b"partial output")
        raise RuntimeError("step crashed")
    assert w.digest is None
    assert list(store.iter_objects()) == []
    assert list((store.root / "tmp").iterdir()) == []


def test_ingest_file_links_and_locks_the_source(store: ArtifactStore, tmp_path: Path) -> None:
    src = store.root / "runs" / "r1" / "out.log"
    src.parent.mkdir(parents=True)
    src.write_bytes(b"log line\n" * 1000)
    digest = store.ingest_file(src)
    assert digest == b3(src.read_bytes())
    assert os.path.samefile(src, store.path_of(digest))  # hard link: bytes written once
    assert stat.S_IMODE(src.stat().st_mode) == 0o444
    copy_src = tmp_path / "elsewhere.log"
    copy_src.write_bytes(b"copied")
    digest2 = store.ingest_file(copy_src, link=False)
    assert not os.path.samefile(copy_src, store.path_of(digest2))
    assert store.read_bytes(digest2) == b"copied"
    assert stat.S_IMODE(copy_src.stat().st_mode) == 0o444


def test_ingest_file_refuses_a_fifo(store: ArtifactStore, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(IntegrityError, match="not a regular file"):
        store.ingest_file(fifo)


def test_verify_detects_a_flipped_byte(store: ArtifactStore) -> None:
    digest = store.ingest_bytes(b"evidence " * 100)
    path = store.path_of(digest)
    os.chmod(path, 0o644)
    raw = bytearray(path.read_bytes())
    raw[37] ^= 0x01
    path.write_bytes(bytes(raw))
    assert not store.verify(digest)
    path.unlink()
    assert not store.verify(digest)
    assert not store.exists(digest)
    with pytest.raises(IntegrityError, match="missing"):
        store.read_bytes(digest)


@pytest.mark.parametrize(
    "bad",
    ["../../etc/passwd", "ab/../../x", "A" * 64, "0" * 63, "0" * 65, "/" + "0" * 63, ""],
)
def test_hostile_digests_are_refused(store: ArtifactStore, bad: str) -> None:
    with pytest.raises(IntegrityError, match="not a blake3 digest"):
        store.path_of(bad)
    with pytest.raises(IntegrityError):
        store.open(bad)
    assert not store.exists(bad)
    assert not store.verify(bad)


@pytest.mark.parametrize(
    "bad", ["..", "../x", "a/b", "/abs", ".hidden", "-x", "a..b", "", "a b", "r\x00"]
)
def test_run_id_traversal_refused(store: ArtifactStore, bad: str) -> None:
    with pytest.raises(UserError):
        store.run_dir(bad)


def test_run_id_accepts_normal_ids(store: ArtifactStore) -> None:
    assert store.run_dir("run-2024.01_x") == store.root / "runs" / "run-2024.01_x"


def test_read_lines_and_span_hash(store: ArtifactStore) -> None:
    text = b"one\ntwo\nthree\nfour"
    digest = store.ingest_bytes(text)
    assert store.read_lines(digest, 2, 3) == [b"two\n", b"three\n"]
    assert store.read_lines(digest, 4, 9) == [b"four"]
    assert store.read_lines(digest, 7, 9) == []
    assert store.span_hash(digest, 2, 3) == b3(b"two\nthree\n")
    assert store.span_hash(digest, 1, 1) == b3(b"one\n")
    with pytest.raises(UserError):
        store.read_lines(digest, 3, 2)
    with pytest.raises(UserError):
        store.span_hash(digest, 0, 1)


def test_lines_longer_than_a_chunk(store: ArtifactStore) -> None:
    long_line = b"x" * (2 * CHUNK + 5) + b"\n"
    digest = store.ingest_bytes(b"head\n" + long_line + b"tail\n")
    assert store.read_lines(digest, 2, 2) == [long_line]
    assert store.span_hash(digest, 2, 3) == b3(long_line + b"tail\n")


@SETTINGS
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    start=st.integers(min_value=1, max_value=35),
    length=st.integers(min_value=0, max_value=10),
)
def test_read_lines_splits_only_on_newline(
    store: ArtifactStore, lines: list[bytes], start: int, length: int
) -> None:
    data = b"\n".join(lines)
    digest = store.ingest_bytes(data)
    all_lines = [line + b"\n" for line in lines[:-1]] + [lines[-1]] if lines else []
    all_lines = [line for line in all_lines if line]  # a file's final empty line is no line
    expected = all_lines[start - 1 : start + length]
    got = store.read_lines(digest, start, start + length)
    assert got == expected
    assert store.span_hash(digest, start, start + length) == b3(b"".join(expected))


def test_hash_file_matches(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(os.urandom(CHUNK + 3))
    assert hash_file(p) == b3(p.read_bytes())


def test_iter_objects_skips_foreign_names(store: ArtifactStore) -> None:
    digest = store.ingest_bytes(b"x")
    (store.root / "objects" / "zz").mkdir()
    (store.root / "objects" / "zz" / "junk").write_bytes(b"")
    assert list(store.iter_objects()) == [digest]


@SETTINGS
@given(
    obj=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )
)
def test_canonical_json_is_stable_under_key_order(obj: object) -> None:
    def reorder(value: object) -> object:
        if isinstance(value, dict):
            return {k: reorder(value[k]) for k in reversed(list(value))}
        if isinstance(value, list):
            return [reorder(v) for v in value]
        return value

    assert canonical_json(reorder(obj)) == canonical_json(obj)
    assert hash_json(reorder(obj)) == hash_json(obj)
    assert canonical_json(obj).decode("utf-8")  # always valid UTF-8


def test_canonical_json_unicode_is_not_escaped() -> None:
    assert canonical_json({"b": "é✓", "a": [1, {"z": None, "y": True}]}) == (
        '{"a":[1,{"y":true,"z":null}],"b":"é✓"}'.encode()
    )


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs a second filesystem")
def test_ingest_file_copies_across_filesystems(store: ArtifactStore) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        src = Path(other) / "out.log"
        src.write_bytes(b"on another filesystem")
        if os.stat(other).st_dev == store.root.stat().st_dev:
            pytest.skip("/dev/shm is on the same filesystem here")
        digest = store.ingest_file(src)
        assert not os.path.samefile(src, store.path_of(digest))
        assert store.read_bytes(digest) == b"on another filesystem"
        assert stat.S_IMODE(src.stat().st_mode) == 0o444


def test_linked_object_is_taken_over_from_a_foreign_owner(store: ArtifactStore) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file owned by someone else")
    src = store.run_dir("r") / "out.log"
    src.parent.mkdir(parents=True)
    src.write_bytes(b"written by the sandbox user")
    os.chown(src, 65534, 65534)
    digest = store.ingest_file(src)
    st = store.path_of(digest).stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o444)  # the sandbox cannot chmod it back


def test_an_objects_folder_swapped_for_a_link_is_never_followed(store: ArtifactStore,
                                                                 tmp_path: Path) -> None:
    """Every folder on an object's path is opened without following a link: the broker,
    which holds the key, checks an attestation's report and manifest through ``verify``,
    and a home writer who swapped ``objects/xx`` for a link steered its open anywhere (a
    review's note; it read through the link on the old code)."""
    digest = store.ingest_bytes(b"evidence")
    sub = store.root / "objects" / digest[:2]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / digest[2:]).write_bytes(b"evidence")
    (sub / digest[2:]).chmod(0o644)
    (sub / digest[2:]).unlink()
    sub.rmdir()
    sub.symlink_to(elsewhere)
    assert not store.verify(digest)
    with pytest.raises(IntegrityError):
        store.read_bytes(digest)


@settings(max_examples=300, deadline=None)
@given(data=st.lists(st.sampled_from([b"\n", b"a", b"bc", b"\n\n", b"defg"]), max_size=40)
       .map(b"".join), chunk=st.integers(1, 9), first=st.integers(1, 30))
def test_lines_before_a_span_are_skipped_as_reading_them_one_by_one_would(
        data: bytes, chunk: int, first: int) -> None:
    """A citation of line 1.7 million of a capped log read every line before it one at a
    time (seconds): they are counted a chunk at a time now, to the same pieces."""
    from choir.evidence import artifacts

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(artifacts, "CHUNK", chunk)
        every = list(artifacts._iter_line_pieces(io.BytesIO(data)))
        skipped = list(artifacts._iter_line_pieces(io.BytesIO(data), first))
    assert skipped == [(n, piece) for n, piece in every if n >= first]
