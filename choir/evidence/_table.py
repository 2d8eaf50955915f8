"""Rows of fixed width keyed by path, in one file and a small delta beside it: how the stat
cache and the records of sealed trees are kept.

Both are read on every round and hold a row per file, so they must load fast at 50,000
files: a row block unpacked by ``struct.iter_unpack`` and a path block decoded and split
once, all in C, load 50,000 rows in 25-70 ms here, where SQLite took 220-380 ms (and 0.8 s to
insert them). A round that changes a few files writes only those rows, to the delta; the
whole table is written again when the delta grows past a tenth of it. Nothing in a table is
code (no pickle, no marshal): a file that is cut, altered or of another format loads as
nothing, and the caller starts from nothing, never from a guess. The tables live in
Choir's store, where executors and steps cannot write; the last 32 bytes of a file are a
blake3 of the rest, against torn writes, not against a writer with the caller's uid
(docs/security.md, "Incremental snapshots").
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import blake3

_MAGIC = b"choir-table 2\n"
_MAX_HEADER = 1 << 20
_MAX_GONE = 2000


def _write(path: Path, fmt: str, meta: dict[str, Any],
           rows: Iterable[tuple[str, tuple[Any, ...]]]) -> None:
    pack = struct.Struct(fmt).pack
    names: list[str] = []
    packed: list[bytes] = []
    for name, row in rows:
        names.append(name)
        packed.append(pack(*row))
    header = json.dumps({**meta, "fmt": fmt, "rows": len(names)}).encode()
    body = b"".join((_MAGIC, len(header).to_bytes(4, "little"), header, b"".join(packed),
                     "\0".join(names).encode("utf-8", "surrogateescape")))
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            fh.write(blake3.blake3(body).digest())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_GONE = object()


class Rows:
    """A table's rows, unpacked only when asked for: a 50,000-row table is one block of
    bytes and an index of its paths (unpacking it whole made 500,000 objects and took
    25-90 ms here), with the rows changed since it was read kept beside it."""

    def __init__(self, fmt: str, block: bytes = b"", names: list[str] | None = None) -> None:
        self._struct = struct.Struct(fmt)
        self._block = block
        self._names = names or []
        self._index = dict(zip(self._names, range(len(self._names)), strict=True))
        self._over: dict[str, Any] = {}

    def get(self, key: str) -> tuple[Any, ...] | None:
        row = self._over.get(key)
        if row is not None:
            return None if row is _GONE else cast(tuple[Any, ...], row)
        at = self._index.get(key)
        return None if at is None else self._struct.unpack_from(self._block,
                                                                at * self._struct.size)

    def __getitem__(self, key: str) -> tuple[Any, ...]:
        row = self.get(key)
        if row is None:
            raise KeyError(key)
        return row

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __len__(self) -> int:
        return len(self.keys())

    def __bool__(self) -> bool:
        dropped = sum(1 for k, v in self._over.items() if v is _GONE and k in self._index)
        added = sum(1 for k, v in self._over.items() if v is not _GONE and k not in self._index)
        return len(self._index) - dropped + added > 0

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> set[str]:
        """Every path with a row (a new set)."""
        gone = {k for k, v in self._over.items() if v is _GONE}
        return (self._index.keys() - gone) | (self._over.keys() - gone)

    def items(self) -> Iterator[tuple[str, tuple[Any, ...]]]:
        for key in self.keys():
            yield key, self[key]

    def where(self, field: int, value: bytes) -> set[str]:
        """The paths whose row has ``value`` in field ``field``, a one-byte field (``c``)
        before any wider one: found in the block without unpacking it; rows changed since
        it was read are looked at one by one."""
        fmt = self._struct.format
        assert fmt[field + 1] == "c", "where() reads one-byte fields of single letters"
        offset = struct.calcsize(fmt[:field + 2]) - 1
        column = self._block[offset::self._struct.size]
        found: set[str] = set()
        at = column.find(value)
        while at >= 0:
            found.add(self._names[at])
            at = column.find(value, at + 1)
        for key, row in self._over.items():
            if row is _GONE or row[field] != value:
                found.discard(key)
            else:
                found.add(key)
        return found

    def update(self, rows: dict[str, tuple[Any, ...]]) -> None:
        self._over.update(rows)

    def drop(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._over[key] = _GONE

    def as_dict(self) -> dict[str, tuple[Any, ...]]:
        return {key: self[key] for key in self.keys()}


def _read(path: Path, fmt: str) -> tuple[dict[str, Any], Rows, bytes] | None:
    """(the meta, the rows, the file's own blake3 check) of the table file at ``path``, or
    None when it is missing, cut, altered or of another format."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read()
    body, check = data[:-32], data[-32:]
    if not body.startswith(_MAGIC) or blake3.blake3(body).digest() != check:
        return None
    at = len(_MAGIC)
    size = int.from_bytes(body[at:at + 4], "little")
    if size > _MAX_HEADER:
        return None
    try:
        meta = json.loads(body[at + 4:at + 4 + size])
        count = int(meta["rows"])
        width = struct.calcsize(fmt)
    except (ValueError, KeyError, TypeError, struct.error):
        return None
    if not isinstance(meta, dict) or meta.get("fmt") != fmt or count < 0:
        return None
    start = at + 4 + size
    end = start + count * width
    if end > len(body):
        return None
    names = body[end:].decode("utf-8", "surrogateescape").split("\0") if count else []
    if len(names) != count or len(set(names)) != count:
        return None
    return meta, Rows(fmt, body[start:end], names), check


class Table:
    """One table: ``rows`` as loaded (the full file with its delta applied), ``save`` with
    the rows a caller changed or dropped since."""

    def __init__(self, path: Path, fmt: str, meta: dict[str, Any] | None = None) -> None:
        """Load the table at ``path``; one whose ``meta`` differs (another git hash length)
        loads empty."""
        self.path = path
        self.fmt = fmt
        self.meta = meta or {}
        self.rows = Rows(fmt)
        self._delta: dict[str, tuple[Any, ...]] = {}
        self._gone: set[str] = set()
        self._gen = ""
        self.loaded = ""  # what was read: the files' own checks (another reader compares)
        full = _read(path, fmt)
        if full is None or any(full[0].get(k) != v for k, v in self.meta.items()):
            return
        self._gen = str(full[0].get("gen", ""))
        self.rows = full[1]
        self.loaded = full[2].hex()
        delta = _read(self._delta_path, fmt)
        if delta is not None and delta[0].get("base") == self._gen:
            self.loaded += "+" + delta[2].hex()
            self._delta = delta[1].as_dict()
            self._gone = {str(p) for p in delta[0].get("gone", ())}
            self.rows.update(self._delta)
            self.rows.drop(self._gone)

    @property
    def _delta_path(self) -> Path:
        return self.path.with_name(self.path.name + ".delta")

    def save(self, changed: dict[str, tuple[Any, ...]], gone: Iterable[str] = ()) -> None:
        """Record ``changed`` rows and drop ``gone`` paths: in the delta while it stays
        small, else by writing the whole table again."""
        gone = set(gone)
        if not changed and not gone:
            return
        self.rows.update(changed)
        self.rows.drop(gone)
        self._delta.update(changed)
        for rel in gone:
            self._delta.pop(rel, None)
        self._gone = (self._gone - changed.keys()) | gone
        if self._gen and len(self._delta) <= max(1000, len(self.rows) // 10) and \
                len(self._gone) <= _MAX_GONE:
            _write(self._delta_path, self.fmt,
                   {**self.meta, "base": self._gen, "gone": sorted(self._gone)},
                   self._delta.items())
            return
        self.replace(self.rows.as_dict())

    def replace(self, rows: dict[str, tuple[Any, ...]]) -> None:
        """Write ``rows`` as the whole table (the delta dropped)."""
        self._gen = secrets.token_hex(8)
        _write(self.path, self.fmt, {**self.meta, "gen": self._gen}, sorted(rows.items()))
        self.rows = Rows(self.fmt)
        self.rows.update(rows)
        self._delta, self._gone = {}, set()
        with contextlib.suppress(FileNotFoundError):
            self._delta_path.unlink()
