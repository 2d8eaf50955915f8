"""Canonical JSON and blake3 hashing: the one definition every hash in Choir uses.

Canonical form: keys sorted, no insignificant white space, UTF-8, no NaN or infinity.
Pydantic models are dumped in JSON mode first, so a model and its dict hash alike.
Hashes are lower-case hex blake3 digests (64 characters), with no prefix.
"""

from __future__ import annotations

import json
from typing import Any

import blake3
from pydantic import BaseModel

HASH_HEX_LEN = 64


def to_jsonable(obj: Any) -> Any:
    """A plain JSON value for ``obj`` (pydantic models in JSON mode)."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    return obj


def canonical_json(obj: Any) -> bytes:
    """Canonical UTF-8 JSON bytes of ``obj``.

    Raises:
        ValueError: ``obj`` holds NaN or infinity, which have no canonical form.
    """
    return json.dumps(
        to_jsonable(obj),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def blake3_hex(data: bytes) -> str:
    """Hex blake3 digest of ``data``."""
    return blake3.blake3(data).hexdigest()


def hash_json(obj: Any) -> str:
    """Hex blake3 digest of the canonical JSON of ``obj``."""
    return blake3_hex(canonical_json(obj))


def is_hash(value: str) -> bool:
    """True when ``value`` looks like a hex blake3 digest."""
    return len(value) == HASH_HEX_LEN and all(c in "0123456789abcdef" for c in value)
