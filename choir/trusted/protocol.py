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
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from choir._core import frames
from choir._core.canonical import canonical_json

MAX_SIGNED = 4 << 20
"""The largest byte string the broker signs (an attestation body is far smaller)."""
MAX_FRAME = MAX_SIGNED * 4 // 3 + 4096


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Request(_Frozen):
    """``hello`` asks for the public key; ``sign`` asks for a signature of ``data``;
    ``channel`` asks for a broker of its own for a fork of the client (``choir serve``'s
    workers), which the reply carries as a descriptor."""

    op: Literal["hello", "sign", "channel"]
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
    pid: int = Field(default=0, ge=0)
    """the new broker's process id (``channel``)."""


def send(sock: socket.socket, message: BaseModel, fds: tuple[int, ...] = ()) -> None:
    """Write one frame (with ``fds``: a new channel handed to the client)."""
    frames.send(sock, canonical_json(message), fds)


def _object(data: bytes | None) -> dict[str, object] | None:
    if data is None:
        return None
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("a frame holds one JSON object")
    return obj


def recv(sock: socket.socket) -> dict[str, object] | None:
    """Read one frame as a JSON object; None on end of stream or an oversized frame.

    Raises:
        ValueError: the frame is not a JSON object.
    """
    return _object(frames.recv(sock, MAX_FRAME))


def recv_with_fd(sock: socket.socket) -> tuple[dict[str, object] | None, int | None]:
    """A reply and the one descriptor that came with it (a ``channel``), if any.

    Raises:
        ValueError: the frame is not a JSON object, or more than one descriptor came.
    """
    data, fds = frames.recv_with_fds(sock, MAX_FRAME, 1)
    return _object(data), (fds[0] if fds else None)
