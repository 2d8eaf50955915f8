"""An offline Choir Agent: it proposes a release, and a verifier decides if it may ship.

Run it with ``python examples/agent/release_agent.py``. No API key and no network: the model
is ``choir.testing.FakeModel``, scripted to make the mistakes real models make (a malformed
answer, then a version that does not move forward) before it gets it right. Swap in any
litellm model name (``model="openai/gpt-4o-mini"``) and the rest stays the same.
"""

from __future__ import annotations

import re
import sys

from pydantic import BaseModel

from choir import Agent, AgentContext
from choir.exceptions import VerificationRejected
from choir.testing import FakeModel, final_output, reply, tool_call

CURRENT = "1.4.2"
CHANGES = ["fix: add() returned a - b", "feat: mul()"]


class Release(BaseModel):
    """What the agent must hand in."""

    version: str
    notes: list[str]


class Approved(BaseModel):
    """What the verifier returns: the output of the run."""

    version: str
    notes: list[str]
    attempts: int


def unreleased_changes() -> list[str]:
    """The commits since the last release, one line each."""
    return CHANGES


def _parse(version: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise VerificationRejected(f"{version!r} is not MAJOR.MINOR.PATCH", code="bad_version")
    return tuple(int(p) for p in version.split("."))


def verify(release: Release, agent_ctx: AgentContext) -> Approved:
    """Ship only a version above the current one, with a note for every change."""
    if _parse(release.version) <= _parse(CURRENT):
        raise VerificationRejected(f"{release.version} does not move past {CURRENT}",
                                   code="version_not_newer", metadata={"current": CURRENT})
    missing = [c for c in CHANGES if not any(c.split(": ", 1)[1] in n for n in release.notes)]
    if missing:
        raise VerificationRejected("release notes miss changes", code="notes_incomplete",
                                   metadata={"missing": missing})
    return Approved(version=release.version, notes=release.notes,
                    attempts=agent_ctx.verification.attempts_used + 1)


def scripted_model() -> FakeModel:
    return FakeModel([
        reply(tool_call("unreleased_changes")),
        final_output(version=1.5),                                   # malformed: no notes
        final_output(version="1.4.1", notes=["fixes"]),               # rejected: not newer
        final_output(version="1.5.0", notes=["add() returned a - b fixed", "new mul()"]),
    ])


def main() -> int:
    agent = Agent(instructions="Prepare the next release of the calc library.",
                  model=scripted_model(), tools=[unreleased_changes], output_type=Release,
                  verifier=verify, verifier_max_attempts=3)
    result = agent.run_sync("What should the next release be?")
    print("events: ", " -> ".join(result.events))
    print("status: ", result.status)
    print("output: ", result.output)
    print("attempts used:", result.context.verification.attempts_used)
    return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
