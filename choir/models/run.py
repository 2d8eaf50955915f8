"""What a run checkpoints between steps: green-thread results, executor attempts, split frames.

These live here, with the other frozen models, so the Director's pure logic and the loop's
state depend on schemas only, never on the modules that execute verifiers or executors.
"""

from __future__ import annotations

from typing import Literal

from choir.models._base import Frozen
from choir.models.report import Usage, VerificationReport
from choir.models.workitem import Mood, WorkItem

ExecutorIsolation = Literal["namespace", "none", "tools"]
"""``namespace``: bwrap; ``none``: unsandboxed (trust mode, or no sandbox available);
``tools``: the ``llm`` executor, Choir's own code acting only through repo-scoped file tools."""


class VerifierRun(Frozen):
    """What a green thread hands back to the control loop: bounded report and hashes only.

    A frozen model, so LangGraph checkpoints it faithfully; it holds no raw output.
    """

    verifier: str
    run_id: str
    lens: str = "default"
    replica: int = 0
    diagnostic: bool = False
    tests: tuple[str, ...] = ()
    report: VerificationReport
    report_hash: str
    manifest_hash: str
    # its INCONCLUSIVE is Choir's side (the sandbox failed, the green thread crashed), not
    # what the step did: only such a run is no evidence beside a PASS (``verdicts``)
    infra: bool = False


class ExecutorOutput(Frozen):
    """One executor attempt: its log's artifact hash, how it ended, where it ran, spend.

    Bounded on purpose: this goes into the run's state, raw output never does.
    """

    artifact: str
    usage: tuple[Usage, ...] = ()
    exit_code: int | None = None
    timed_out: bool = False
    isolation: ExecutorIsolation = "tools"


class ParentFrame(Frozen):
    """The split work item, saved while its parts run; restored for the final verification.

    A part may split again: its frame then keeps the parts still to do at its own level
    (``parts``) and the frame above it (``parent``), so finishing the inner parts returns to
    exactly where the outer split was.
    """

    item: WorkItem
    attempt: int
    mood: Mood
    history: tuple[tuple[str, ...], ...] = ()
    reports: tuple[VerificationReport, ...] = ()
    floor: tuple[str, ...] = ()
    parts: tuple[WorkItem, ...] = ()
    parent: ParentFrame | None = None

    @property
    def depth(self) -> int:
        """How many splits deep the frame's parts are (1: parts of the run's work item)."""
        return 1 + (self.parent.depth if self.parent is not None else 0)

    @property
    def root(self) -> ParentFrame:
        return self.parent.root if self.parent is not None else self
