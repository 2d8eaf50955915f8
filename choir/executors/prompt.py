"""What an executor is told: the work item and the last round as bounded prompt text.

One place for the ``llm`` executor (Choir's own agent) and the ``agent`` executor (an agent
program such as Claude Code): both get the same work item block
(``prompts/executor_user.md``) and the same rendering of the previous round, built only from
bounded report fields (summary, failing test ids, next actions), each one escaped line.
Raw verifier output never reaches it (invariant 2 of the architecture, in docs/).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from choir._core.resources import load_text
from choir.models import Result, VerificationReport, WorkItem

MAX_VALUE = 200
MAX_FEEDBACK_REPORTS = 8  # reports that did not pass, each with its details
MAX_FEEDBACK_SIGNATURES = 5  # failing tests named per report
MAX_PASSED_NAMES = 20  # passing verifiers named on one line
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def one_line(text: str, limit: int = MAX_VALUE) -> str:
    """First line only, control characters removed, escaped, and clipped with a marker."""
    lines = str(text).strip().splitlines() or [""]
    line = _CONTROL.sub("", lines[0]).strip()
    more = len(lines) > 1
    if len(line) > limit:
        line, more = line[:limit], True
    return _escape(line) + (" [...]" if more else "")


def feedback_text(reports: Sequence[VerificationReport]) -> str:
    """The previous round, as the model may see it: bounded fields of bounded reports.

    What did not pass comes first (in plan order), at most ``MAX_FEEDBACK_REPORTS`` of them
    with their first failing tests; the passes are named on one line after. Every cut says
    how much it left out: a failure the executor is not told of is one it cannot fix.
    """
    if not reports:
        return ""
    failed = [r for r in reports if r.result is not Result.PASS]
    passed = [r.verifier for r in reports if r.result is Result.PASS]
    # fenced as data: the failing tests' text is the code under test's, and inside the work
    # item's message it read as the owner's instruction (review 17d); every value is escaped
    # by ``one_line``, so none closes the fence
    lines = ["<previous_verification>",
             "The previous attempt was verified and did not pass:"]
    if not failed:
        lines.append("- (no report failed; the round as a whole was not accepted)")
    for report in failed[:MAX_FEEDBACK_REPORTS]:
        lines.append(f"- {report.verifier}: {report.result.value}: {one_line(report.summary)}")
        sigs = report.failure_signatures
        for sig in sigs[:MAX_FEEDBACK_SIGNATURES]:
            lines.append(f"  - failing: {one_line(sig.test_id or sig.kind, 160)}"
                         f" ({one_line(sig.excerpt or '', 160)})")
        hidden = max(0, len(sigs) - MAX_FEEDBACK_SIGNATURES) + report.signatures_truncated
        if hidden:
            lines.append(f"  - ({hidden} more failing not shown)")
        for action in report.next_actions[:3]:
            lines.append(f"  - next: {one_line(action, 200)}")
    if len(failed) > MAX_FEEDBACK_REPORTS:
        lines.append(f"- ({len(failed) - MAX_FEEDBACK_REPORTS} more reports that did not "
                     "pass not shown)")
    if passed:
        names = ", ".join(one_line(n, 64) for n in passed[:MAX_PASSED_NAMES])
        more = len(passed) - MAX_PASSED_NAMES
        lines.append(f"Passed: {names}" + (f" ({more} more passed, not shown)"
                                           if more > 0 else ""))
    return "\n".join([*lines, "</previous_verification>"])


def work_prompt(item: WorkItem, attempt: int, feedback: Sequence[VerificationReport]) -> str:
    """The work item block: id, attempt, goal, scope and the previous round's feedback."""
    return load_text("prompts", "executor_user.md").format(
        work_item=item.id, attempt=attempt, goal=item.goal,
        scope="\n".join(f"- {s}" for s in item.scope) or "(whole repository)",
        feedback=feedback_text(feedback)).strip()


def agent_prompt(item: WorkItem, attempt: int, feedback: Sequence[VerificationReport]) -> str:
    """The whole prompt an agent program gets (``CHOIR_PROMPT_FILE``): how Choir runs it,
    the work item's own instructions, then the work item block."""
    instructions = item.executor.instructions or "(none)"
    return load_text("prompts", "agent_cli.md").format(
        instructions=instructions, task=work_prompt(item, attempt, feedback)).strip() + "\n"
