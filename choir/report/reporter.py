"""The cheap-model reporter: words a report; never decides it.

It reads bounded windows of the artifact (the cited spans and the tail, within a character
budget: never a whole log), fences them as untrusted data, asks for a narrow JSON reply and
validates it. Whatever the model says, the result can only stay or go down (PASS may become
INCONCLUSIVE; FLAKY is only a note until reruns show it), confidence can only go down, every
field is clamped, and wording that pastes log text is dropped (reports cite by
pointer), so a log cannot use the reporter to carry its bytes into the loop. Faults (429, 5xx,
timeouts, bad JSON, schema violations, oversized replies) are retried with backoff inside a
deadline; then the deterministic report is used, marked ``deterministic_fallback``. The run
never crashes because of the model.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from choir._core.resources import load_text
from choir._core.terminal import shorten
from choir.llm import ask_json
from choir.models import Result, Usage, VerificationReport
from choir.models.report import HYPERTHESIS_MAX, NEXT_ACTION_MAX, SUMMARY_MAX
from choir.report.bound import fit

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore
    from choir.verification.pipeline import PipelineResult

WINDOW_BUDGET = 6000  # characters of log the model may see, in all
COPY_RUN = 20  # letters and digits: a longer run of the log in the model's wording is a paste
REPLY_MAX = 8000
ATTEMPTS = 3


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")
    summary: str = Field(max_length=4000)
    next_actions: list[str] = Field(min_length=1, max_length=10)
    confidence: float = Field(ge=0.0, le=1.0)
    hyperthesis: list[str] = Field(default_factory=list, max_length=10)
    propose: Literal["none", "inconclusive", "flaky"] = "none"


def clean_text(text: str) -> str:
    """Printable text only: ANSI escapes, control and bidi characters removed."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    return "".join(ch for ch in text if ch in "\n\t" or (ch.isprintable() and
                                                      ch not in "\u202a\u202b\u202c\u202d"
                                                      "\u202e\u2066\u2067\u2068\u2069"))


def windows(report: VerificationReport, result: PipelineResult, store: ArtifactStore) -> str:
    """The cited spans (with a little context) and the tail, within ``WINDOW_BUDGET``."""
    pieces: list[str] = []
    budget = WINDOW_BUDGET
    for sig in report.failure_signatures:
        if sig.citation is None or budget <= 0:
            continue
        start = max(1, sig.citation.line_start - 3)
        lines = store.read_lines(sig.citation.artifact, start, sig.citation.line_end + 3,
                                 line_max=300)
        text = clean_text(b"".join(line[:300] for line in lines).decode("utf-8", "replace"))
        pieces.append(f"[lines {start}-{sig.citation.line_end + 3}]\n{text[:budget]}")
        budget -= len(pieces[-1])
    if budget > 0:
        tail = clean_text("\n".join(line[:300] for line in result.tail_log.splitlines()[-40:]))
        pieces.append(f"[tail]\n{tail[-budget:]}")
    return "\n".join(pieces)


def _messages(report: VerificationReport, text: str) -> list[dict[str, str]]:
    fence = secrets.token_hex(8)
    text = text.replace(f"<<<end-{fence}>>>", "")
    # the signatures inside the fence too: a test id and its excerpt are the program's
    # output, and outside the fence they read as parsed fact (review 17d)
    sigs = [f"{s.test_id or s.kind}: {s.excerpt}".replace(f"<<<end-{fence}>>>", "")
            for s in report.failure_signatures]
    user = load_text("prompts", "reporter_user.md").format(
        verifier=report.verifier, verifier_type=report.verifier_type,
        result=report.result.value, counts=report.counts.model_dump_json(),
        signatures=json.dumps(sigs)[:2000], fence=fence, windows=text)
    return [{"role": "system", "content": load_text("prompts", "reporter_system.md")},
            {"role": "user", "content": user}]


def _clip(text: str, limit: int) -> str:
    return shorten(clean_text(text).strip(), limit)


def _flat(text: str) -> str:
    """Letters and digits only, case-folded: zero-width characters, escapes, spacing and
    punctuation inserted into a copy do not hide it."""
    return "".join(ch for ch in text.casefold() if ch.isalnum())


def _shingles(text: str) -> set[str]:
    flat = _flat(text)
    return {flat[i:i + COPY_RUN] for i in range(len(flat) - COPY_RUN + 1)}


class _NoCopy:
    """Reports cite by pointer, not paste: model wording that repeats a run of
    ``COPY_RUN`` letters and digits of the log it was shown, which the deterministic report
    does not already carry, is dropped. A log cannot smuggle text (a secret, an instruction
    for the next prompt) into the control loop by asking the reporter to repeat it.

    Limits, by design of a filter rather than a proof: a run shorter than ``COPY_RUN``
    passes, and so does an encoding (base64, a translation). What bounds a report is its
    schema and sizes; this rule removes the easy path.
    """

    def __init__(self, seen: str, report: VerificationReport) -> None:
        own = " ".join([report.summary, *report.next_actions, *report.hyperthesis,
                        *(f"{s.test_id or ''} {s.excerpt or ''} {s.location or ''}"
                          for s in report.failure_signatures)])
        self.log = _shingles(seen) - _shingles(own)
        self.dropped = 0

    def ok(self, text: str) -> bool:
        if self.log.isdisjoint(_shingles(text)):
            return True
        self.dropped += 1
        return False


PASTED = "The reporter pasted log text; that wording was dropped."


def _unpasted(seen: str, base: VerificationReport, summary: str, actions: list[str],
              hyper: list[str], keep: list[str]) -> tuple[str, list[str], list[str]]:
    """The wording without what pastes text of the log ``seen``: a field that does is
    dropped, all of it when a paste is split across fields, and ``PASTED`` says so first.
    ``keep`` (Choir's own lines) is never checked. Dropped summary and actions become
    ``base``'s."""
    paste = _NoCopy(seen, base)
    hyper = [*keep, *(h for h in hyper if paste.ok(h))]
    actions = [a for a in actions if paste.ok(a)]
    summary = summary if paste.ok(summary) else ""
    if not paste.ok("".join([summary, *actions, *hyper])):  # a paste split across fields
        hyper, actions, summary = list(base.hyperthesis), [], ""
    if paste.dropped:
        hyper.insert(0, PASTED)
    return summary or base.summary, actions or list(base.next_actions), hyper


def merge(report: VerificationReport, reply: _Reply, usage: Usage,
          seen: str = "") -> VerificationReport:
    """Apply a validated reply under the rules: never up, always bounded, never pasted."""
    result = report.result
    keep = list(report.hyperthesis)
    if reply.propose == "inconclusive" and result is Result.PASS:
        result = Result.INCONCLUSIVE
    if reply.propose == "flaky":
        keep.append("The reporter suspects flakiness; only rerun evidence can make it FLAKY.")
    summary, actions, hyper = _unpasted(
        seen, report, _clip(reply.summary, SUMMARY_MAX),
        [_clip(a, NEXT_ACTION_MAX) for a in reply.next_actions if a.strip()],
        [_clip(h, HYPERTHESIS_MAX) for h in reply.hyperthesis if h.strip()], keep)
    return report.model_copy(update={
        "result": result,
        "summary": summary,
        "next_actions": tuple(actions[:3]),
        "confidence": min(report.confidence, reply.confidence),
        "hyperthesis": tuple(dict.fromkeys(hyper))[:4],
        "reporter": "model",
        "usage": usage,
    })


async def model_report(report: VerificationReport, *, result: PipelineResult,
                       store: ArtifactStore, model: str,
                       deadline_s: float = 30.0) -> VerificationReport:

    seen = windows(report, result, store)
    parsed, spent, fault = await ask_json(model, _messages(report, seen), _Reply,
                                          deadline_s=deadline_s, attempts=ATTEMPTS,
                                          reply_max=REPLY_MAX, temperature=0)
    if parsed is None:
        if not _NoCopy(seen, report).ok(fault):  # an error body may echo the prompt
            fault = fault.split(":", 1)[0] + " (its message quoted the log; dropped)"
        return fallback(report, fault, spent)
    return merge(report, parsed, spent, seen)


def fallback(report: VerificationReport, fault: str,
             usage: Usage | None = None) -> VerificationReport:
    """The deterministic report, saying why the model did not word it.

    The fault is the model client's own error (never log bytes), clipped; a user reading
    ``deterministic_fallback`` can tell a rate limit from a missing key or a timeout.
    """
    note = _clip(f"The reporter model was not used: {fault or 'no reason given'}.",
                 HYPERTHESIS_MAX)
    update: dict[str, object] = {"reporter": "deterministic_fallback",
                                 "hyperthesis": (*report.hyperthesis, note)[-4:]}
    if usage is not None:
        update["usage"] = usage
    return report.model_copy(update=update)


async def as_built(report: VerificationReport, *, result: PipelineResult, store: ArtifactStore,
                   model: str | None, deadline_s: float) -> VerificationReport:
    """The ``deterministic`` reporter: the report as the parser and the exit codes built it."""
    return report


# what a reporter may never change: the evidence and what was read from it
_EVIDENCE = ("schema_version", "verifier", "verifier_type", "target", "failure_signatures",
             "signatures_truncated", "counts", "parser", "parser_truncated", "artifacts",
             "log_cut_bytes")


def bounded(base: VerificationReport, worded: object, name: str,
            seen: str) -> VerificationReport:
    """Whatever reporter worded ``base`` (built-in or a plugin), hold it to the rules.

    The result only stays or goes from PASS to INCONCLUSIVE; the evidence fields stay as
    built; confidence never rises; wording that pastes log text (``seen``) is dropped. A
    reply that is not a report, or that changes evidence, is refused for the deterministic
    report, saying why. The report names the reporter by its registered name, or
    ``deterministic_fallback`` when it kept the base's wording and said it fell back; only
    Choir's own ``model`` reporter reports usage.
    """
    if not isinstance(worded, VerificationReport):
        return fallback(base, f"reporter '{name}' returned {type(worded).__name__}, "
                              "not a report")
    try:  # built with model_construct, or edited in place: every bound checked again
        worded = fit(worded, wording_first=True)
    except ValueError as exc:
        return fallback(base, f"reporter '{name}' returned an invalid report "
                              f"({type(exc).__name__}); its wording was refused")
    changed = [f for f in _EVIDENCE if getattr(worded, f) != getattr(base, f)]
    if changed:
        return fallback(base, f"reporter '{name}' changed evidence fields "
                              f"({', '.join(changed)}); its wording was refused")
    allowed = {base.result} | ({Result.INCONCLUSIVE} if base.result is Result.PASS else set())
    if worded.result not in allowed:
        return fallback(base, f"reporter '{name}' changed the result {base.result.value} "
                              f"to {worded.result.value}; its wording was refused")
    # the label is the reporter's own claim: it stands only for a report worded as the
    # base was (a fallback adds its note and nothing else); one that says it fell back and
    # pastes, raises confidence or words anew is named as what it is (review 20)
    fell_back = worded.reporter == "deterministic_fallback" and \
        (worded.summary, worded.next_actions) == (base.summary, base.next_actions)
    summary, actions, hyper = _unpasted(seen, base, worded.summary, list(worded.next_actions),
                                        list(worded.hyperthesis), [])
    return worded.model_copy(update={
        "summary": summary, "next_actions": tuple(actions),
        "hyperthesis": tuple(dict.fromkeys(hyper))[:4],
        "confidence": min(base.confidence, worded.confidence),
        "reporter": "deterministic_fallback" if fell_back else name,
        # Choir's model reporter counts what it spent; a plugin's figures are its to invent
        "usage": worded.usage if name == "model" else base.usage,
    })
