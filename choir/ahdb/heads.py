"""Signed chain heads: the AHDB's anchor against deleted, rewritten, truncated or added events.

A hash chain alone proves nothing against someone who can write the database: delete an event,
recompute every later hash, and the chain is whole again. So every write signs ``(seq, head
hash)`` with this home's ed25519 key and stores the record in the database's ``heads`` table
in the event's own transaction (a kill can lose both, never one), then copies it to a file
beside the database. Audit then requires that the chain reaches every signed head with
exactly that hash: rewriting the past changes the hash at a signed seq, and cutting the tail
leaves a signed head beyond it. An event past the last trusted signed head was written
without the key, and an honest Choir never writes one: audit names each
(``ahdb_unsigned_tail``), the gate refuses to answer, and an honest writer refuses to sign a
head over it (review 12, F1: it used to, "laundering" the forged events). Together with every
attestation's outcome being in the log (``rules``, ``outcome``), an attacker must also delete
the attestations, whose runs then show as unattested. Rolling back every store at once,
consistently, is beyond what files on one machine can show: ``choir.ahdb.anchor`` pins a head
outside the home for that.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from choir._core import fsopen
from choir._core.canonical import canonical_json
from choir.attest.keys import decode_public_key, key_id_of, key_refusal, verify_signature

if TYPE_CHECKING:
    from choir.attest import SigningKey

HEAD_TYPE = "choir.ahdb-head/v1"


@dataclass(frozen=True)
class Head:
    seq: int
    head: str
    key_id: str
    public_key: str
    signature: str


def heads_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".heads")


def signed_bytes(seq: int, head: str) -> bytes:
    return canonical_json({"type": HEAD_TYPE, "seq": seq, "head": head})


def head_line(seq: int, head: str, signer: SigningKey) -> bytes:
    """One signed head record: a line of canonical JSON."""
    return canonical_json({"seq": seq, "head": head, "key_id": signer.key_id,
                           "public_key": signer.public_key,
                           "signature": signer.sign(signed_bytes(seq, head))}) + b"\n"


def append_head(path: Path, line: bytes) -> None:
    """Append one signed head record; a single O_APPEND write, so concurrent writers never mix.

    The store keeps this file as a copy, written after the commit: the record that counts
    is the one in the database, committed with its event (``Backend.publish_head``).
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def parse(raw: bytes, where: str = "the record") -> Head | str:
    """One head record as a ``Head``, or why it is not one."""
    try:
        data = json.loads(raw)
        return Head(int(data["seq"]), str(data["head"]), str(data["key_id"]),
                    str(data["public_key"]), str(data["signature"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"{where} is not a head record"


def read_heads(path: Path, shared: Iterable[bytes] = ()) -> Iterator[Head | str]:
    """Each record (the file's, then ``shared`` ones) as a ``Head``, or why it is not one."""
    if path.exists() or path.is_symlink():
        try:
            lines = _lines(path)
        except OSError as exc:
            yield f"the file cannot be read: {exc.strerror or exc}"
            lines = []
        for number, raw in enumerate(lines, start=1):
            # every record is written whole with its line end: one without it was cut
            yield parse(raw, f"line {number}") if raw.endswith(b"\n") else \
                f"line {number} is torn (no line end)"
    for number, raw in enumerate(shared, start=1):
        yield parse(raw, f"shared head {number}")


MAX_LINE = 4096
"""A head record is about 300 bytes; a longer line is not one (and is not read whole)."""
MAX_FILE = 1 << 30


def _lines(path: Path) -> list[bytes]:
    """The file's lines, read as ``choir._core.fsopen`` opens: never through a link, never a
    FIFO or a device (one planted here hung ``choir audit``, a link to ``/dev/zero`` ran it
    out of memory: review 21, F2), each line at most ``MAX_LINE`` bytes (the rest of a
    longer one is skipped, so it reads as torn or malformed, never held whole).

    Raises:
        OSError: the file is a link, not a regular file, or larger than ``MAX_FILE``.
    """
    dfd = fsopen.open_dir(path.parent)
    try:
        fd, st = fsopen.open_regular(path.name, dfd)
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > MAX_FILE:
            raise OSError(errno.EFBIG, f"larger than {MAX_FILE} bytes")
        lines = []
        while raw := fh.readline(MAX_LINE):
            lines.append(raw)
            while not raw.endswith(b"\n") and len(raw) == MAX_LINE:  # skip the overlong rest
                raw = fh.readline(MAX_LINE)
        return lines


def head_key_id(head: Head) -> str | None:
    """The id of the key that validly signed ``head``; None when the signature does not hold."""
    if not verify_signature(head.public_key, signed_bytes(head.seq, head.head), head.signature):
        return None
    return key_id_of(decode_public_key(head.public_key).public_bytes_raw())


def latest_signed(heads: Iterable[Head | str], chain: Mapping[int, str],
                  trusted_keys: Collection[str]) -> Head | None:
    """The latest head that the log honours (``chain``: seq -> event hash) and a trusted key
    validly signed; None when there is none. Every event up to it is covered by it: the chain
    links them, and an honest writer signs no head over a tail it cannot show was signed
    (``AHDB._check_signed_tail``). Signatures are checked latest first, until one holds."""
    candidates = {(h.seq, h.head, h.signature): h for h in heads
                  if isinstance(h, Head) and chain.get(h.seq) == h.head}
    for head in sorted(candidates.values(), key=lambda h: h.seq, reverse=True):
        if head_key_id(head) in trusted_keys:
            return head
    return None


def check_heads(path: Path, chain: dict[int, str], tail: int,
                trusted_keys: Collection[str], shared: Iterable[bytes] = (),
                revoked_keys: Collection[str] = ()) -> list[tuple[str, str, str, str]]:
    """(kind, object, expected, found) for every signed head the chain does not honour.

    ``chain`` maps seq to event hash for the log as stored; ``tail`` is its last seq.
    ``shared``: records other machines published to a shared store (Postgres); this
    machine's file still anchors its own writes if someone deletes those.
    """
    found: list[tuple[str, str, str, str]] = []
    count, seen = 0, set()
    for head in read_heads(path, shared):
        if isinstance(head, str):
            found.append(("ahdb_head_unreadable", str(path), "a signed head record", head))
            continue
        count += 1
        if head in seen:  # the file's copy of a record the database holds: checked once
            continue
        seen.add(head)
        where = f"signed head at seq {head.seq}"
        key_id = head_key_id(head)
        if key_id is None:
            found.append(("ahdb_head_signature", where, "a valid signature", "invalid"))
        elif (refusal := key_refusal(key_id, trusted_keys, revoked_keys)) is not None:
            found.append((f"ahdb_head_{refusal[0]}", where, refusal[1], key_id))
        elif head.seq > tail:
            found.append(("ahdb_truncated", where, f"the log reaches seq {head.seq}",
                          f"it ends at seq {tail}"))
        elif chain.get(head.seq) != head.head:
            found.append(("ahdb_head_mismatch", where, head.head,
                          chain.get(head.seq, "no such event")))
    if tail and not count:
        found.append(("ahdb_heads_missing", str(path), "signed heads for a non-empty log",
                      "none"))
    return found
