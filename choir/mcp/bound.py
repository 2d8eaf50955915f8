"""What an agent receives: the report bounds of the main loop, and nothing a terminal acts on.

Each report already fits ``REPORT_MAX_BYTES`` (``choir.report.bound``); a session is cut to the
reports the executor of ``choir run`` hears (``MAX_FEEDBACK_REPORTS``), held-out checks as counts
only (``choir.evidence.heldout.redact``). Every string, whoever wrote it (a verifier's summary,
a test id, an excerpt), loses its escape sequences and control characters (an agent pastes
them into a terminal) and is cut at ``TEXT_MAX``. ``RESPONSE_MAX`` bounds a whole answer; an
answer that would exceed it drops reports from the end, and says how many.
"""

from __future__ import annotations

import json
from typing import Any

from choir._core.terminal import shorten, strip_controls
from choir.executors.prompt import MAX_FEEDBACK_REPORTS
from choir.models.report import REPORT_MAX_BYTES, SUMMARY_MAX

TEXT_MAX = SUMMARY_MAX
LIST_MAX = 50
# every report at its bound, plus the session's own fields
RESPONSE_MAX = MAX_FEEDBACK_REPORTS * REPORT_MAX_BYTES + 8 * 1024


def clean(value: Any, limit: int = TEXT_MAX) -> Any:
    """``value`` with every string stripped of controls and shortened; keys too (a test id
    can be a key). Every cut says how much it left out: a list under a key keeps
    ``LIST_MAX`` items and its count goes in ``{key}_truncated`` beside it (added to one
    already there), a dict keeps ``LIST_MAX`` keys and counts the rest in
    ``_keys_truncated``, and any other list keeps ``LIST_MAX - 1`` items and ends with
    ``"(N more not shown)"``. Cleaning a cleaned value changes nothing."""
    if isinstance(value, str):
        return shorten(strip_controls(value), limit)
    if isinstance(value, dict):
        return _clean_dict(value, limit)
    if isinstance(value, list | tuple):
        if len(value) <= LIST_MAX:
            return [clean(v, limit) for v in value]
        kept = [clean(v, limit) for v in list(value)[:LIST_MAX - 1]]
        return [*kept, f"({len(value) - len(kept)} more not shown)"]
    return value


def _is_count(key: Any, value: Any) -> bool:
    return (isinstance(key, str) and key.endswith("_truncated") and isinstance(value, int)
            and not isinstance(value, bool))


def _clean_dict(value: dict[Any, Any], limit: int) -> dict[Any, Any]:
    """``clean`` of a dict: counts of earlier cuts are kept apart from the ``LIST_MAX``
    keys (at most ``LIST_MAX`` of them too), so they are never the ones cut."""
    counts = [(k, v) for k, v in value.items() if _is_count(k, v)][:LIST_MAX]
    entries = [(k, v) for k, v in value.items() if not _is_count(k, v)]
    out: dict[Any, Any] = {}
    cut: dict[str, int] = {}
    for key, item in entries[:LIST_MAX]:
        name = clean(key, 200)
        if isinstance(item, list | tuple) and len(item) > LIST_MAX:
            cut[f"{name}_truncated"] = len(item) - LIST_MAX
            item = list(item)[:LIST_MAX]
        out[name] = clean(item, limit)
    for key, count in counts:
        out[clean(key, 200)] = count
    for key, count in cut.items():
        out[key] = int(out.get(key) or 0) + count
    if len(entries) > LIST_MAX:
        out["_keys_truncated"] = int(out.get("_keys_truncated") or 0) + len(entries) - LIST_MAX
    return out


def size(value: Any) -> int:
    return len(json.dumps(value, sort_keys=True, ensure_ascii=False).encode())


def fit(answer: dict[str, Any], key: str = "reports") -> dict[str, Any]:
    """``answer`` (already ``clean``) within ``RESPONSE_MAX``: drops entries of ``key`` from
    the end, counting them in ``{key}_truncated``; then, if still too big, every string is cut
    harder. Never raises."""
    answer = dict(answer)
    items = list(answer.get(key) or [])
    dropped = int(answer.get(f"{key}_truncated") or 0)
    while items and size(answer) > RESPONSE_MAX:
        items.pop()
        dropped += 1
        answer[key], answer[f"{key}_truncated"] = items, dropped
    if size(answer) > RESPONSE_MAX:
        answer = clean(answer, 80)
    return answer


__all__ = ["RESPONSE_MAX", "TEXT_MAX", "clean", "fit"]
