"""Executors by name: what changes the working tree between verification rounds.

``command`` runs a shell command in the repo with ``CHOIR_WORKITEM_FILE``, ``CHOIR_ATTEMPT``
and ``CHOIR_FEEDBACK_FILE`` (the last round's reports as bounded JSON: never raw output).
``python`` calls ``module:function(work_item, attempt, feedback)``. Executor output goes to
the artifact store, never into the control state.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from choir.exceptions import ConfigError
from choir.models import Usage, VerificationReport, WorkItem
from choir.models._base import Frozen


class ExecutorOutput(Frozen):
    """What one executor attempt left behind: its log's artifact hash, and model spend."""

    artifact: str
    usage: tuple[Usage, ...] = ()


class Executor(Protocol):
    """``executor(item, attempt, feedback, run_id=...)``: one attempt at the work item."""

    def __call__(self, item: WorkItem, attempt: int, feedback: Sequence[VerificationReport],
                 run_id: str | None = None) -> ExecutorOutput: ...


_REGISTRY: dict[str, Executor] = {}


def register_executor(name: str) -> Callable[[Executor], Executor]:
    def decorate(fn: Executor) -> Executor:
        _REGISTRY[name] = fn
        return fn

    return decorate


def get_executor(name: str) -> Executor:
    if name == "llm" and name not in _REGISTRY:
        import choir.agent.executor  # noqa: F401 - registers itself; imports the agent stack
    if name not in _REGISTRY:
        raise ConfigError(f"executor kind '{name}' is not available here; known: "
                          f"{', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def feedback_json(reports: Sequence[VerificationReport]) -> bytes:
    """The executor's view of the last round: bounded reports only."""
    return json.dumps([r.model_dump(mode="json") for r in reports], indent=1).encode()


@register_executor("command")
def run_command(item: WorkItem, attempt: int, feedback: Sequence[VerificationReport],
                run_id: str | None = None) -> ExecutorOutput:
    """Run the command; its output goes to the artifact store."""
    from choir.artifacts import ArtifactStore

    assert item.executor.command
    with tempfile.TemporaryDirectory(prefix="choir-exec-") as tmp:
        env = dict(os.environ, CHOIR_ATTEMPT=str(attempt))
        if run_id:
            env["CHOIR_RUN_ID"] = run_id
        item_file = Path(tmp) / "workitem.json"
        item_file.write_text(item.model_dump_json())
        env["CHOIR_WORKITEM_FILE"] = str(item_file)
        env.pop("CHOIR_FEEDBACK_FILE", None)
        if feedback:
            fb = Path(tmp) / "feedback.json"
            fb.write_bytes(feedback_json(feedback))
            env["CHOIR_FEEDBACK_FILE"] = str(fb)
        log = Path(tmp) / "executor.log"
        with open(log, "wb") as out:
            try:
                proc = subprocess.run(item.executor.command, shell=True, cwd=item.repo, env=env,
                                      stdout=out, stderr=subprocess.STDOUT,
                                      timeout=item.executor.timeout_s)
                out.write(f"\n[choir] executor exited {proc.returncode}\n".encode())
            except subprocess.TimeoutExpired:
                out.write(b"\n[choir] executor timed out\n")
        return ExecutorOutput(artifact=ArtifactStore().ingest_file(log, link=False))


@register_executor("python")
def run_python(item: WorkItem, attempt: int, feedback: Sequence[VerificationReport],
               run_id: str | None = None) -> ExecutorOutput:
    from choir.artifacts import ArtifactStore

    module, _, name = (item.executor.function or "").partition(":")
    fn = getattr(importlib.import_module(module), name)
    result = fn(item, attempt, list(feedback))
    if isinstance(result, ExecutorOutput):
        return result
    return ExecutorOutput(artifact=ArtifactStore().ingest_bytes(str(result).encode()[:65536]))
