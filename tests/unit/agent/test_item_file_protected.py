"""Review 21, a doubt left open: the llm executor's protected set did not list a work item
file kept inside its repo, which the command and python executors bind read-only. A model
told to could rewrite the item it runs under with ``write_file`` (its edit was refused only
after the round, and by the next run)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest

import choir.agent.executor as executor_module
from choir.graph.runner import run_work_item
from choir.models import WorkItem
from choir.testing import FakeModel, final_output, reply, tool_call
from tests.workitems import calc_repo

RIGHT = "def add(a, b):\n    return a + b\n"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=p", "-c", "user.email=p@p",
                    *args], capture_output=True, check=True)


def test_the_llm_executor_may_not_write_its_work_item_inside_the_repo(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Old code: the model's ``write_file`` of ``item.yaml`` answered "overwrote" and the
    file held ``mood: CALM``; now it is refused as protected, as ``choir.yaml`` is."""
    repo = calc_repo(tmp_path / "repo", canary="c", sandbox="local")
    item = repo / "item.yaml"
    body = ("id: fix-add\ngoal: add must add\nrepo: .\nmood: CURIOUS\nmax_attempts: 1\n"
            "executor: {kind: llm, model: x}\n")
    item.write_text(body)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    model = FakeModel([reply(tool_call("write_file", {"path": "item.yaml",
                                                       "content": body.replace("CURIOUS",
                                                                               "CALM")})),
                       reply(tool_call("write_file", {"path": "calc.py", "content": RIGHT})),
                       final_output(summary="add fixed")])
    real = executor_module.build_agent

    def scripted(work: WorkItem, run_id: str, **_: Any) -> Any:
        return real(work, run_id, model=model)

    monkeypatch.setattr(executor_module, "build_agent", scripted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        asyncio.run(run_work_item(item))
    assert item.read_text() == body
    answer = model.requests[1][-1]
    assert answer["role"] == "tool" and "item.yaml is protected" in json.dumps(answer)
