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
    """``value`` with every string stripped of controls and shortened, every list cut at
    ``LIST_MAX``; keys too (a test id can be a key)."""
    if isinstance(value, str):
        return shorten(strip_controls(value), limit)
    if isinstance(value, dict):
        return {clean(k, 200): clean(v, limit) for k, v in list(value.items())[:LIST_MAX]}
    if isinstance(value, list | tuple):
        return [clean(v, limit) for v in list(value)[:LIST_MAX]]
    return value


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
