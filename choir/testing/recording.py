"""A scripted executor that records what it was given: for testing policies and loops.

Use it as a ``python`` executor (``function: mymodule:executor`` where ``executor =
RecordingExecutor(...)``). On attempt N it writes the files of ``edits[N-1]`` (when there
is one) into the work item's repo, and records the attempt and the feedback it received,
in memory and, with ``log``, as JSON lines (for runs in another process).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from choir.evidence.artifacts import ArtifactStore
from choir.models import ExecutorOutput, VerificationReport, WorkItem


@dataclass
class RecordingExecutor:
    edits: Sequence[Mapping[str, str]] = ()
    log: Path | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, item: WorkItem, attempt: int,
                 feedback: Sequence[VerificationReport]) -> ExecutorOutput:

        root = Path(item.repo).resolve()
        written: list[str] = []
        if attempt <= len(self.edits):
            for rel, content in self.edits[attempt - 1].items():
                path = (root / rel).resolve()
                if not path.is_relative_to(root):
                    raise ValueError(f"edit {rel!r} leaves the repo")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
                written.append(rel)
        call = {"work_item": item.id, "attempt": attempt, "written": written,
                "feedback": [r.model_dump(mode="json") for r in feedback]}
        self.calls.append(call)
        if self.log is not None:
            with open(self.log, "a") as out:
                out.write(json.dumps(call) + "\n")
        summary = f"attempt {attempt}: wrote {', '.join(written) or 'nothing'}\n"
        return ExecutorOutput(artifact=ArtifactStore().ingest_bytes(summary.encode()))

    @staticmethod
    def read_log(path: Path) -> list[dict[str, Any]]:
        """The calls recorded in ``path`` by this executor in any process."""
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
