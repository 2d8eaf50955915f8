"""Import paths from before the package layout (issue #12) keep working for one release.

Users' code and stored checkpoints name the old modules; each must still be the very same
module (or class) as its new home, and a checkpoint that names the old type paths must load.
"""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path

import pytest

OLD_TO_NEW = {
    "choir._canonical": "choir._core.canonical",
    "choir._paths": "choir._core.paths",
    "choir._resources": "choir._core.resources",
    "choir._terminal": "choir._core.terminal",
    "choir._failpoints": "choir._core.failpoints",
    "choir._yaml": "choir.config._yaml",
    "choir._exec_python": "choir.executors._python_child",
    "choir.policy": "choir.config.policy",
    "choir.presets": "choir.config.presets",
    "choir.artifacts": "choir.evidence.artifacts",
    "choir.tree": "choir.evidence.tree",
    "choir.pipeline": "choir.verification.pipeline",
    "choir.director_model": "choir.director.advisor",
    "choir.lenses": "choir.director.lenses",
    "choir.split": "choir.director.split",
    "choir.verify": "choir.app.verify",
    "choir.gate": "choir.app.gate",
    "choir.attest.verify": "choir.attest.check",
    "choir.report.model": "choir.report.reporter",
    "choir.agent.model": "choir.agent.llm",
}

# names users and checkpoints reach through the old paths: (old module, name, new module)
OLD_NAMES = [
    ("choir.verification", "VerifierRun", "choir.models"),
    ("choir.executors", "ExecutorOutput", "choir.models"),
    ("choir.split", "ParentFrame", "choir.models"),
    ("choir.verify", "averify_tree", "choir.app.verify"),
    ("choir.verify", "resolve_target", "choir.evidence.target"),
    ("choir.verify", "new_run_id", "choir._core.ids"),
    ("choir.config", "load_repo_config", "choir.config"),
    ("choir.policy", "Policy", "choir.config.policy"),
    ("choir.director", "plan", "choir.director"),
    ("choir.tree", "tree_hash", "choir.evidence.tree"),
    ("choir.gate", "check_gate", "choir.app.gate"),
]


@pytest.mark.parametrize(("old", "new"), sorted(OLD_TO_NEW.items()))
def test_old_module_path_is_the_new_module(old: str, new: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(new)
    assert importlib.import_module(new).__spec__.name == new  # the new module is untouched


def test_old_paths_import_first_in_a_fresh_process() -> None:
    import subprocess
    import sys

    code = ("import choir.tree, choir.verify, choir.split, choir.attest.verify\n"
            "from choir.verify import averify_tree\n"
            "from choir.evidence.tree import tree_hash\n"
            "assert choir.tree.tree_hash is tree_hash and choir.verify.averify_tree\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(("old", "name", "new"), OLD_NAMES)
def test_old_name_is_the_same_object(old: str, name: str, new: str) -> None:
    assert getattr(importlib.import_module(old), name) is getattr(
        importlib.import_module(new), name)


def test_python_executor_child_runs_by_its_old_path(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "choir._exec_python", "nocolon"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "expected module:function" in out.stderr


def _samples() -> dict[str, object]:
    from choir.models import (
        Counts,
        ParentFrame,
        Result,
        Target,
        VerificationReport,
        VerifierRun,
        WorkItem,
    )

    report = VerificationReport(
        verifier="unit", verifier_type="unit_tests", result=Result.FAIL,
        target=Target(tree_hash="t" * 64), counts=Counts(failed=1), summary="1 failed",
        next_actions=("fix add",), confidence=0.9)
    run = VerifierRun(verifier="unit", run_id="r-1", report=report, report_hash="h" * 64,
                      manifest_hash="m" * 64)
    item = WorkItem(id="fix-add", goal="add", repo=".",
                    executor={"kind": "command", "command": "true"})
    return {"runs": [run], "parent": ParentFrame(item=item, attempt=2, mood="CALM")}


async def test_checkpoint_written_with_old_type_paths_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint from before the move records ``choir.verification.VerifierRun`` and
    ``choir.split.ParentFrame``; the runner's saver must read it back as the same types."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from choir.graph.state import checkpoint_types
    from choir.models import ParentFrame, VerifierRun

    values = _samples()
    db = tmp_path / "checkpoints.sqlite"
    cfg = {"configurable": {"thread_id": "old-run", "checkpoint_ns": ""}}
    with monkeypatch.context() as old:  # the classes as they were named before the move
        old.setattr(VerifierRun, "__module__", "choir.verification")
        old.setattr(ParentFrame, "__module__", "choir.split")
        async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
            saver.serde = JsonPlusSerializer(allowed_msgpack_modules=checkpoint_types())
            ckpt = empty_checkpoint()
            ckpt["channel_values"] = dict(values)
            await saver.aput(cfg, ckpt, {"source": "loop", "step": 1}, {})
    blobs = b"".join(row[0] for row in sqlite3.connect(db).execute(
        "select checkpoint from checkpoints"))
    assert b"choir.verification" in blobs and b"choir.split" in blobs
    assert b"choir.models.run" not in blobs

    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        saver.serde = JsonPlusSerializer(allowed_msgpack_modules=checkpoint_types())
        got = await saver.aget_tuple({"configurable": {"thread_id": "old-run"}})
    assert got is not None
    loaded = got.checkpoint["channel_values"]
    assert type(loaded["runs"][0]) is VerifierRun and loaded["runs"] == values["runs"]
    assert type(loaded["parent"]) is ParentFrame and loaded["parent"] == values["parent"]
