"""The README's team example (``examples/team/run.sh``), exactly as a user runs it: a plan
of three items through ``choir plan run`` (confined, its worktrees overlays of the store's
checkouts), then ``choir gate`` and ``choir promote``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow,  # CI's slow stage: the README's command stays under 5 minutes
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")]


def test_the_team_example_merges_every_item_through_the_gate_and_promotes(
        tmp_path: Path) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               CHOIR_HOME=str(tmp_path / "home"), KEEP="1")
    env.pop("CHOIR_ARTIFACT_DIR")
    proc = subprocess.run(["bash", str(ROOT / "examples/team/run.sh")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "plan demo: asserted" in out and "gate: demo ASSERTed" in out
    assert "promote: main -> " in out
    work = Path(out.split("== kept ", 1)[1].split()[0])
    try:
        # every item's own commit is on the promoted branch (which of them the queue merged
        # and which it fast-forwarded depends on which finished first)
        shown = subprocess.run(["git", "-C", str(work / "repo"), "log", "--format=%s", "main"],
                               capture_output=True, text=True, check=True).stdout.split("\n")
        assert {"a: write a", "b: copy a into b", "z: write z"} <= set(shown), shown
        # the plan's worktrees are gone, and so are git's records of them
        listed = subprocess.run(["git", "-C", str(work / "repo"), "worktree", "list"],
                                capture_output=True, text=True, check=True).stdout
        assert len(listed.strip().splitlines()) == 1, listed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # the example itself is never modified: the job works on a copy
    assert not (ROOT / "examples/team/repo/.git").exists()
