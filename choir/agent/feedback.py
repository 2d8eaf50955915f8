"""The compact, deterministic ``<verification_rejected>`` message a model sees.

Everything in it comes from the verifier's ``VerificationRejected`` and is treated as
hostile: the code is reduced to a safe token, text is escaped so it cannot close the tag
or open another, each string is one bounded line (a raw log never passes), and metadata is
cut to a few keys and items, with the cut said out loud.
"""

from __future__ import annotations

import re
from typing import Any

from choir.executors.prompt import one_line

__all__ = ["one_line", "rejection_feedback", "safe_code", "sanitize_metadata"]

MAX_MESSAGE = 600
MAX_KEYS = 12
MAX_ITEMS = 10
_CODE = re.compile(r"[^a-z0-9_.-]+")


def safe_code(code: str | None) -> str:
    """A tag-safe code: lower-case ``[a-z0-9_.-]``, at most 64 characters."""
    cleaned = _CODE.sub("_", (code or "rejected").lower()).strip("_")[:64]
    return cleaned or "rejected"


def _value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        shown = [one_line(str(v), 120) for v in list(value)[:MAX_ITEMS]]
        extra = len(value) - len(shown)
        return ", ".join(shown) + (f" (+{extra} more)" if extra > 0 else "")
    if isinstance(value, dict):
        return one_line(", ".join(f"{k}={v}" for k, v in sorted(value.items(), key=str)))
    return one_line(str(value))


def sanitize_metadata(metadata: dict[str, Any] | None) -> dict[str, str]:
    """At most ``MAX_KEYS`` keys (sorted), each value one bounded line."""
    if not metadata:
        return {}
    keys = sorted(metadata, key=str)
    out = {safe_code(str(k)): _value(metadata[k]) for k in keys[:MAX_KEYS]}
    if len(keys) > MAX_KEYS:
        out["omitted_keys"] = str(len(keys) - MAX_KEYS)
    return out


def rejection_feedback(message: str, code: str | None, metadata: dict[str, Any] | None, *,
                       attempts_used: int, max_attempts: int, repeats: int = 1,
                       max_repeats: int = 0) -> str:
    """The feedback block appended for a rejected candidate. Same input, same bytes."""
    lines = [f'<verification_rejected code="{safe_code(code)}">',
             f"Summary: {one_line(message, MAX_MESSAGE)}"]
    for key, value in sanitize_metadata(metadata).items():
        lines.append(f"- {key}: {value}")
    if repeats > 1:
        lines.append(f"This identical candidate was rejected {repeats} times"
                     + (f" (the run ends at {max_repeats})" if max_repeats else "")
                     + ": it cannot pass unchanged.")
    lines.append(f"Attempts used: {attempts_used} of {max_attempts}. "
                 "Revise, then call final_output again.")
    lines.append("</verification_rejected>")
    return "\n".join(lines)
