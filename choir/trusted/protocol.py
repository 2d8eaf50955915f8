"""The broker's wire format: length-prefixed canonical JSON, typed by frozen models.

A frame is a 4-byte big-endian length and that many bytes of canonical JSON. A frame longer
than ``MAX_FRAME`` is never read: the broker answers nothing and closes the channel, so a
confused or hostile client cannot make it buffer without bound. Each request is one
``Request`` (an operation and, for ``sign``, the bytes to sign in base64); each answer is one
``Reply``. Anything that does not validate is refused without looking further.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from choir._core.canonical import canonical_json

MAX_SIGNED = 4 << 20
"""The largest byte string the broker signs (an attestation body is far smaller)."""
MAX_FRAME = MAX_SIGNED * 4 // 3 + 4096
_HEADER = struct.Struct(">I")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Request(_Frozen):
    """``hello`` asks for the public key; ``sign`` asks for a signature of ``data``."""

    op: Literal["hello", "sign"]
    data: str = Field(default="", max_length=MAX_FRAME)
    """base64 of the bytes to sign (``sign`` only)."""


class Reply(_Frozen):
    """The key (``hello``), a signature (``sign``), or why the broker refused."""

    ok: bool
    key_id: str = Field(default="", max_length=64)
    public_key: str = Field(default="", max_length=64)
    signature: str = Field(default="", max_length=128)
    kind: str = Field(default="", max_length=32)
    """what the broker recognised the signed bytes as (``attestation``, ``head``, ...)."""
    error: str = Field(default="", max_length=2000)


def send(sock: socket.socket, message: BaseModel) -> None:
    """Write one frame."""
    data = canonical_json(message)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> dict[str, object] | None:
    """Read one frame as a JSON object; None on end of stream or an oversized frame.

    Raises:
        ValueError: the frame is not a JSON object.
    """
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        return None
    data = _recv_exact(sock, size)
    if data is None:
        return None
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("a frame holds one JSON object")
    return obj
