"""The verifier's record is read beside its step, once the step has started: read beside the
launch, it held the interpreter lock that the launch's system calls wait for (a warm toolz
request's launch took 12 ms instead of 3)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import choir.verification as verification
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import tree_hash
from choir.models import StepSpec, Target, VerifierKind, VerifierSpec
from choir.sandbox import get_sandbox, stop


def _spec(command: str) -> VerifierSpec:
    return VerifierSpec(name="unit", kind=VerifierKind.UNIT_TESTS,
                        steps=(StepSpec(name="check", command=command),), timeout_s=30)


def _run(tmp_path: Path, spec: VerifierSpec, run_id: str, **kw: Any) -> None:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    (repo / "mod.py").write_text("x = 1\n")
    asyncio.run(verification.run_verifier_thread(
        spec, repo=repo, target=Target(work_item="wi", tree_hash=tree_hash(repo)),
        sandbox=get_sandbox("local"), store=ArtifactStore(), run_id=run_id, **kw))


def test_the_record_is_read_once_the_step_has_started(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, float]] = []
    started = stop.started

    def step_started(pid: int) -> None:
        seen.append(("step", time.monotonic()))
        started(pid)

    def history(verifier: str) -> None:
        seen.append(("history", time.monotonic()))

    monkeypatch.setattr(stop, "started", step_started)
    monkeypatch.setattr(verification, "verifier_history", history)
    _run(tmp_path, _spec("sleep 0.3"), "t-begun")
    assert [what for what, _ in seen] == ["step", "history"], seen
    assert stop._BEGUN == {}  # nothing kept for a run that is over


def test_a_run_that_starts_no_step_here_reads_it_without_waiting(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner elsewhere (a cluster's) or a replayed run starts no local step: the record
    is read when the run is over, not after ``HISTORY_WAIT_S``."""
    read: list[str] = []
    monkeypatch.setattr(verification, "verifier_history", lambda v: read.append(v))
    monkeypatch.setattr(verification, "HISTORY_WAIT_S", 30.0)
    real = verification.run_verifier

    def elsewhere(*args: Any, **kw: Any) -> Any:
        time.sleep(0.2)  # as a cluster's worker would, then the sealed run lands here
        return real(*args, **kw)

    monkeypatch.setattr(stop, "started", lambda pid: None)  # its steps register nothing here
    start = time.monotonic()
    _run(tmp_path, _spec("true"), "t-elsewhere", runner=elsewhere)
    assert read == ["unit"] and time.monotonic() - start < 10
