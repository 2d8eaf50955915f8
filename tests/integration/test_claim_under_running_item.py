"""A claim under a running work item's id never answers for that item (review 22b, F3).

While round 1 of ``choir run`` ran, its executor (an agent with ``choir mcp``'s verify,
``claim=<item id>``, ``mood=CALM``) ASSERTed a claim under the item's own id: the run had
written nothing to the AHDB yet, so the claim was allowed; the run's SKEPTICAL lint then
FAILed, and ``choir gate ITEM`` opened on the claim's ASSERT.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import forked
from tests.workitems import PY

CONFIG = """\
verifiers:
  unit:
    kind: unit_tests
    steps: [{name: t, command: "python3 -c 'import calc; assert calc.add(2, 3) == 5'"}]
    parser: generic
  lint:
    kind: lint
    steps: [{name: l, command: "python3 -c 'assert \\"TODO\\" not in open(\\"calc.py\\").read()'"}]
    parser: generic
moods:
  CALM: {verifiers: [unit]}
sandbox: {backend: local}
"""


def _choir(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=120, cwd=cwd, env=dict(os.environ))


def _running_item(tmp_path: Path) -> tuple[Path, subprocess.Popen[str]]:
    """A repo whose lint FAILs, and ``choir run`` of item ``wi`` on it (SKEPTICAL), its
    executor waiting in round 1 until ``.git/go`` exists."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # TODO\n")
    (repo / "choir.yaml").write_text(CONFIG)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    item = tmp_path / "item.yaml"
    item.write_text(f"id: wi\ngoal: keep add adding, no TODOs left\nrepo: {repo}\n"
                    "mood: SKEPTICAL\nmax_attempts: 1\nexecutor:\n  kind: command\n"
                    "  command: \"touch .git/started; for i in $(seq 300); do "
                    "[ -e .git/go ] && break; sleep 0.1; done\"\n")
    run = subprocess.Popen([PY, "-m", "choir", "run", str(item), "--run-id", "r1"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ))
    deadline = time.monotonic() + 60
    while not (repo / ".git" / "started").exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
        time.sleep(0.05)
    return repo, run


def _finish(repo: Path, run: subprocess.Popen[str]) -> None:
    (repo / ".git" / "go").touch()
    out = run.communicate(timeout=120)[0]
    assert run.returncode == 1 and "lint" in out, out  # halted: the lint FAILs this tree


def _claim(repo: Path) -> subprocess.CompletedProcess[str]:
    """What ``choir mcp``'s verify runs for ``claim=wi, mood=CALM``."""
    return _choir("verify", "--repo", str(repo), "--json", "--mood", "CALM", "--claim", "wi",
                  "--base", "HEAD")


@pytest.mark.slow
def test_a_claim_under_the_id_of_a_running_item_is_refused(tmp_path: Path) -> None:
    repo, run = _running_item(tmp_path)
    try:
        claim = _claim(repo)
    finally:
        _finish(repo, run)
    assert claim.returncode == 2, claim.stdout + claim.stderr
    assert "wi" in claim.stderr and "another claim name" in claim.stderr, claim.stderr
    gate = _choir("gate", "wi", "--repo", str(repo))
    assert gate.returncode == 1, gate.stdout + gate.stderr


@pytest.mark.slow
def test_the_gate_of_a_run_item_does_not_open_on_a_claim(tmp_path: Path) -> None:
    """The run's mark is not seen where the claim is made (another machine sharing the
    AHDB: here, removed): the claim is recorded, but the gate of an item a run wrote
    events for opens only on a run's ASSERT."""
    repo, run = _running_item(tmp_path)
    try:
        shutil.rmtree(Path(os.environ["CHOIR_HOME"]) / "items", ignore_errors=True)
        claim = _claim(repo)
    finally:
        _finish(repo, run)
    assert claim.returncode == 0, claim.stdout + claim.stderr
    gate = _choir("gate", "wi", "--repo", str(repo))
    assert gate.returncode == 1, gate.stdout + gate.stderr
    assert "only a `choir run`" in gate.stdout + gate.stderr, gate.stdout + gate.stderr
