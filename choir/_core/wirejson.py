"""JSON for the warm service's client, without the ``json`` package.

``choir verify`` asks a running ``choir serve`` before it imports anything it may not need
(``choir.serve.client``), and ``json`` imports ``re``, and ``re`` imports ``enum``: 6-10 ms of
every warm command. The client's messages are small and of a few plain kinds (objects,
arrays, strings, integers, booleans, null), so it encodes them here with CPython's own string
escaper and decodes the service's answers with CPython's own scanner (``_json``, the
accelerator ``json`` itself uses). An interpreter without it falls back to ``json``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any

_quote: Any = None
_make_scanner: Any = None
try:
    from _json import encode_basestring_ascii as _quote
    from _json import make_scanner as _make_scanner
except ImportError:  # pragma: no cover - an interpreter without CPython's accelerator
    pass

_SPACE = " \t\n\r"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON this wire takes")


class _Decoding:
    """What ``_json``'s scanner reads from its context: ``json``'s defaults, but NaN and
    Infinity refused and floats read as ``float``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_no_constant)
    memo: dict[str, str] = {}


_scan = _make_scanner(_Decoding) if _make_scanner is not None else None


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON, ASCII (every other character escaped, as ``json.dumps``).

    Raises:
        TypeError: something that is not an object with string keys, an array, a string,
            an integer, a boolean or None (floats are not sent on this wire).
    """
    if _quote is None:  # pragma: no cover
        import json

        return json.dumps(value, separators=(",", ":")).encode()
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("ascii")


def _encode(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(_quote(value))
    elif value is None or value is True or value is False:
        out.append({None: "null", True: "true", False: "false"}[value])
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, dict):
        out.append("{")
        for n, (key, item) in enumerate(value.items()):
            if not isinstance(key, str):
                raise TypeError(f"an object key must be a string, not {type(key).__name__}")
            out.append(("," if n else "") + _quote(key) + ":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for n, item in enumerate(value):
            if n:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not sent on this wire")


def loads(data: bytes) -> Any:
    """One JSON value, with nothing but white space around it.

    Raises:
        ValueError: not UTF-8, not JSON, NaN or Infinity, or something after the value.
    """
    text = data.decode("utf-8")
    if _scan is None:  # pragma: no cover
        import json

        return json.loads(text)
    start = len(text) - len(text.lstrip(_SPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration:
        raise ValueError(f"no JSON value at character {start}") from None
    if text[end:].strip(_SPACE):
        raise ValueError(f"extra data after the JSON value, at character {end}")
    return value


__all__ = ["dumps", "loads"]
