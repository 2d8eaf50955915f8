"""The Director's optional model (``models.director``): a plan suggestion, bounded.

The plan may be model-suggested but is policy-bounded. What the model can
do is deliberately small: add verifiers from the allowlist to the policy's plan. It cannot
remove one, cannot name anything else (such names are dropped and recorded, never run), and
never sees raw verifier output: only the work item, the allowlist, and the last round's
bounded reports, fenced as untrusted data. A model that fails, times out or answers out of
schema costs the round nothing but its deadline: the policy's plan runs unchanged.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from choir._core.resources import load_text
from choir.llm import ask_json
from choir.models import Mood, Usage, VerificationReport, VerifierSpec, WorkItem
from choir.report.reporter import clean_text

DEADLINE_S = 30.0
REPLY_MAX = 4000
_LAST_ROUND_MAX = 3000


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")
    verifiers: list[str] = Field(default_factory=list, max_length=32)
    reason: str = Field(default="", max_length=2000)


@dataclass(frozen=True)
class Suggestion:
    """What the model suggested (unfiltered: ``plan`` filters), why, and what it cost."""

    names: tuple[str, ...] | None
    reason: str
    usage: Usage


def _allowlist(specs: Mapping[str, VerifierSpec]) -> str:
    return "\n".join(f"- {name}: {spec.kind.value} (steps: "
                     f"{', '.join(step.name for step in spec.steps)})"
                     for name, spec in sorted(specs.items()))


def _last_round(reports: Sequence[VerificationReport]) -> str:
    lines = []
    for report in reports[:16]:
        tests = [s.test_id or s.kind for s in report.failure_signatures[:5]]
        lines.append(f"- {report.verifier}: {report.result.value}; "
                     f"{clean_text(report.summary)[:200]}"
                     + (f"; failing: {', '.join(t[:120] for t in tests)}" if tests else ""))
    return "\n".join(lines)[:_LAST_ROUND_MAX] or "(none yet)"


def messages(item: WorkItem, *, mood: Mood, attempt: int, planned: Sequence[str],
             specs: Mapping[str, VerifierSpec],
             last: Sequence[VerificationReport]) -> list[dict[str, str]]:
    """The prompt: trusted configuration in the open, report text inside a random fence."""
    fence = secrets.token_hex(8)
    last_round = _last_round(last).replace(fence, "")
    user = load_text("prompts", "director_user.md").format(
        work_item=item.id, goal=item.goal[:1000], scope=json.dumps(list(item.scope))[:1000],
        mood=mood.value, attempt=attempt, planned=", ".join(planned) or "(none)",
        allowlist=_allowlist(specs), fence=fence, last_round=last_round)
    return [{"role": "system", "content": load_text("prompts", "director_system.md")},
            {"role": "user", "content": user}]


async def suggest(model: str, item: WorkItem, *, mood: Mood, attempt: int,
                  planned: Sequence[str], specs: Mapping[str, VerifierSpec],
                  last: Sequence[VerificationReport],
                  deadline_s: float = DEADLINE_S) -> Suggestion:
    """Ask ``model`` which allowlisted verifiers to add; never raises for model faults."""

    reply, spent, fault = await ask_json(
        model, messages(item, mood=mood, attempt=attempt, planned=planned, specs=specs,
                        last=last),
        _Reply, deadline_s=deadline_s, reply_max=REPLY_MAX, temperature=0)
    if reply is None:
        return Suggestion(None, f"director model gave no usable plan ({fault})", spent)
    names = tuple(dict.fromkeys(clean_text(n).strip()[:64] for n in reply.verifiers))
    return Suggestion(names, clean_text(reply.reason).strip()[:300], spent)
