"""One rule engine: an attested FAIL of a tree blocks any later ASSERT of it, whoever looked.

The attack: ``choir verify`` FAILs a tree, then ``choir run`` on the very same tree (an
executor that changes nothing) gets a PASS from a verifier that disagrees with itself (here:
it fails once, then passes), PROMOTEs and ASSERTs, and the gate opens. A tree does not
change, so the two verdicts disagree: the evidence is FLAKY and must never promote. Audit
already said so (``ahdb_contradicted``); the write path must decide it the same way.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests import forked
from tests.workitems import PY, calc_repo


def choir(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=timeout)


def flaky_repo(tmp_path: Path, *, first: str = "fails") -> Path:
    """A test that fails (or passes) the first time it runs and does the opposite every
    time after (a marker outside the sandboxed repo remembers): the hostile or flaky
    verifier."""
    marker = tmp_path / "seen"
    body = textwrap.dedent(f"""\
        import pathlib

        def test_add():
            marker = pathlib.Path({str(marker)!r})
            first = not marker.exists()
            marker.touch()
            assert {"not " if first == "fails" else ""}first
        """)
    return calc_repo(tmp_path / "repo", canary="c", sandbox="local", test_body=body)


def noop_item(tmp_path: Path) -> Path:
    """A work item over ``tmp_path/repo`` whose executor changes nothing."""
    item = tmp_path / "item.yaml"
    item.write_text("id: wi\ngoal: add must add\nrepo: ./repo\nmax_attempts: 2\n"
                    "executor:\n  kind: command\n  command: \"true\"\n")
    return item


@pytest.mark.slow  # a whole run or two: CI's slow stage
def test_a_verify_fail_blocks_a_later_run_assert_of_the_same_tree(tmp_path: Path) -> None:
    repo = flaky_repo(tmp_path)
    verify = choir("verify", "--repo", str(repo), "--json")
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["status"] == "FAIL"
    run = choir("run", str(noop_item(tmp_path)), "--run-id", "r1", "--json")
    out = json.loads(run.stdout)
    assert out["status"] != "asserted", out
    assert choir("gate", "wi", "--repo", str(repo)).returncode == 1
    atoms = json.loads(choir("ahdb", "list", "--json").stdout)
    assert not [a for a in atoms if a["kind"] == "ASSERT" and a["status"] == "PROMOTED"]
    audited = choir("audit", "--json")
    assert audited.returncode == 0, audited.stdout


def test_a_verify_fail_blocks_a_later_verify_claim_of_the_same_tree(tmp_path: Path) -> None:
    """The same attack through ``choir verify --claim``: no ASSERT, no traceback."""
    repo = flaky_repo(tmp_path)
    assert choir("verify", "--repo", str(repo)).returncode == 1
    claimed = choir("verify", "--repo", str(repo), "--claim", "ci-main", "--json")
    assert "Traceback" not in claimed.stderr, claimed.stderr
    assert json.loads(claimed.stdout)["claim"]["asserted"] is None, claimed.stdout
    assert choir("gate", "ci-main", "--repo", str(repo)).returncode == 1
    assert choir("audit").returncode == 0
