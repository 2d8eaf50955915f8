"""Every report fits the documented bound: at most ``REPORT_MAX_BYTES`` of JSON.

Each field has its own cap, but the caps added up came to about 20 KB (eight signatures of
long test ids, locations and excerpts, a 600-character summary, four hypertheses) while the
docs promise under 4 KB, and a report is what reaches every prompt and the executor. ``fit``
makes any report fit by giving up the least informative text first: hypertheses beyond the
first, long next actions, signatures from the end (counted in ``signatures_truncated``, so
the reader knows more failed), excerpts, non-manifest artifacts (counted in the summary's
last words, ``unlisted_note``), then the summary's tail. The summary goes after the
artifacts because it is where the deterministic report says why: a cut log's size and step
were lost to 15 long artifact names before (review 23b). The result, the counts and
``log_cut_bytes`` are never touched. The model refuses to be built larger
(``VerificationReport``'s validator), so a reporter cannot skip this.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from choir._core.terminal import shorten
from choir.models import VerificationReport
from choir.models.report import REPORT_MAX_BYTES, SUMMARY_MAX

_UNLISTED = re.compile(
    r"; (\d+) more artifact\(s\) not listed \(the manifest lists every file\)$")


def unlisted_note(count: int) -> str:
    """A summary's last words when the report lists ``count`` fewer artifacts than the run
    made; ``fit`` keeps them last and counts what it drops too."""
    return f"; {count} more artifact(s) not listed (the manifest lists every file)"


def _unlisted(summary: str) -> tuple[str, int]:
    """``summary`` without its ``unlisted_note``, and the count the note gave (0: none)."""
    match = _UNLISTED.search(summary)
    return (summary[:match.start()], int(match.group(1))) if match else (summary, 0)


def size(fields: dict[str, Any]) -> int:
    """Bytes of the report's JSON, as ``model_dump_json`` writes it."""
    return len(VerificationReport.model_construct(**fields).model_dump_json(
        warnings=False).encode())


def _steps(f: dict[str, Any], wording_first: bool) -> list[Callable[[], bool]]:
    """Reductions in order; each changes ``f`` and says whether it could."""

    def hyper() -> bool:
        if len(f["hyperthesis"]) <= 1:
            return False
        f["hyperthesis"] = tuple(f["hyperthesis"][:-1])
        return True

    def actions() -> bool:
        long = [a for a in f["next_actions"] if len(a) > 80]
        if long:
            f["next_actions"] = tuple(shorten(a, 80) for a in f["next_actions"])
            return True
        if len(f["next_actions"]) > 1:
            f["next_actions"] = tuple(f["next_actions"][:1])
            return True
        return False

    def signature() -> bool:
        sigs = tuple(f["failure_signatures"])
        if len(sigs) <= 1:
            return False
        f["failure_signatures"] = sigs[:-1]
        f["signatures_truncated"] = f["signatures_truncated"] + 1
        return True

    def excerpts() -> bool:
        sigs = tuple(f["failure_signatures"])
        if not any(len(s.excerpt) > 60 for s in sigs):
            return False
        f["failure_signatures"] = tuple(
            s.model_copy(update={"excerpt": shorten(s.excerpt, 60)}) for s in sigs)
        return True

    def summary() -> bool:
        head, unlisted = _unlisted(f["summary"])
        if len(head) <= 160:
            return False
        f["summary"] = shorten(head, max(160, len(head) // 2)) + \
            (unlisted_note(unlisted) if unlisted else "")
        return True

    def artifacts() -> bool:
        extra = [k for k in f["artifacts"] if k != "manifest"]
        if not extra:
            return False
        f["artifacts"] = {k: v for k, v in f["artifacts"].items() if k != extra[-1]}
        head, unlisted = _unlisted(f["summary"])
        note = unlisted_note(unlisted + 1)
        f["summary"] = shorten(head, SUMMARY_MAX - len(note)) + note
        return True

    def hyper_short() -> bool:
        if not any(len(h) > 120 for h in f["hyperthesis"]):
            return False
        f["hyperthesis"] = tuple(shorten(h, 120) for h in f["hyperthesis"])
        return True

    def ids() -> bool:
        sigs = tuple(f["failure_signatures"])
        if not any(len(s.test_id or "") > 120 or len(s.location or "") > 120 for s in sigs):
            return False
        f["failure_signatures"] = tuple(s.model_copy(update={
            "test_id": shorten(s.test_id, 120) if s.test_id else s.test_id,
            "location": s.location[-120:] if s.location else s.location}) for s in sigs)
        return True

    def last_signature() -> bool:
        if not f["failure_signatures"]:
            return False
        f["failure_signatures"] = ()
        f["signatures_truncated"] = f["signatures_truncated"] + 1
        return True

    if wording_first:
        return [hyper, actions, summary, hyper_short, signature, excerpts, artifacts, ids,
                last_signature]
    return [hyper, actions, signature, excerpts, artifacts, summary, hyper_short, ids,
            last_signature]


def fit(report: VerificationReport, *, wording_first: bool = False) -> VerificationReport:
    """``report`` within ``REPORT_MAX_BYTES`` (itself when it already fits), validated.

    ``wording_first`` gives up the summary and hypertheses before any evidence: for a
    reporter's wording of a report whose evidence already fit (``reporter.bounded``), where a
    dropped artifact or signature would read as changed evidence and refuse the wording.
    """
    fields = dict(report)
    if size(fields) <= REPORT_MAX_BYTES:
        return VerificationReport.model_validate(report.model_dump(warnings=False))
    steps = _steps(fields, wording_first)
    while size(fields) > REPORT_MAX_BYTES:
        if not any(step() for step in steps):
            break  # nothing left to give up: the validator below names the overflow
    return VerificationReport.model_validate(
        VerificationReport.model_construct(**fields).model_dump(warnings=False))
