"""Rollback: someone who can write ``CHOIR_HOME`` puts back an earlier copy of it, from before
an attested FAIL demoted an ASSERT. Every file there agrees with every other (log, signed
heads, attestations), so the gate opens again and audit is clean: only an anchor kept
outside the home tells the two states apart (``choir audit --expect-head``, the gate's
high-water mark, ``choir gate --expect-head``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import forked
from tests.evidence import attest, make_repo
from tests.integration.test_rule_engine import flaky_repo, noop_item
from tests.workitems import PY

# a real home per test, rolled back and audited:
# CI's slow stage runs it, so that the README's command stays under five minutes
pytestmark = pytest.mark.slow


def choir(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=300, env={**os.environ, **env})


def _kinds(proc: subprocess.CompletedProcess[str]) -> set[str]:
    return {v["kind"] for v in json.loads(proc.stdout)["violations"]}


@pytest.fixture
def world(tmp_path: Path, choir_home: Path) -> dict[str, Path]:
    """An ASSERT (a run whose test passes once), then a ``choir verify`` FAIL of the same
    tree that demotes it; the gate saw both; a head pinned after the FAIL; and the copy of
    the home from before the FAIL, which the attacker puts back."""
    repo = flaky_repo(tmp_path, first="passes")
    item = noop_item(tmp_path)
    run = choir("run", str(item), "--run-id", "r1", "--json")
    assert json.loads(run.stdout)["status"] == "asserted", run.stderr
    assert choir("gate", "wi", "--repo", str(repo)).returncode == 0  # the gate saw this head
    before = tmp_path / "home-before-the-fail"
    shutil.copytree(choir_home, before, symlinks=True)
    assert choir("verify", "--repo", str(repo)).returncode == 1  # the FAIL demotes
    assert choir("gate", "wi", "--repo", str(repo)).returncode == 1  # ... and seen again
    pin = tmp_path / "pinned-head.json"
    exported = choir("audit", "--export-head", str(pin))
    assert exported.returncode == 0 and pin.is_file(), exported.stdout + exported.stderr
    return {"home": choir_home, "before": before, "repo": repo, "pin": pin}


def _roll_back(world: dict[str, Path]) -> None:
    shutil.rmtree(world["home"])
    shutil.copytree(world["before"], world["home"], symlinks=True)


def test_a_rollback_is_invisible_inside_the_home(world: dict[str, Path]) -> None:
    """The attack as it stands without an anchor: the gate opens, audit is clean."""
    _roll_back(world)
    assert choir("gate", "wi", "--repo", str(world["repo"]), CHOIR_SEEN_HEADS="").returncode == 0
    assert choir("audit").returncode == 0


def test_audit_with_the_pinned_head_names_the_rollback(world: dict[str, Path]) -> None:
    assert choir("audit", "--expect-head", str(world["pin"])).returncode == 0
    _roll_back(world)
    proc = choir("audit", "--json", "--expect-head", str(world["pin"]))
    assert proc.returncode == 1 and _kinds(proc) == {"ahdb_rollback"}, proc.stdout


def test_the_gate_refuses_a_store_behind_a_head_it_has_seen(world: dict[str, Path]) -> None:
    _roll_back(world)
    proc = choir("gate", "wi", "--repo", str(world["repo"]))
    assert proc.returncode == 1 and "rolled back" in proc.stdout, proc.stdout
    pinned = choir("gate", "wi", "--repo", str(world["repo"]), "--expect-head",
                   str(world["pin"]), CHOIR_SEEN_HEADS="")
    assert pinned.returncode == 1 and "rolled back" in pinned.stdout, pinned.stdout


def test_a_rollback_written_past_the_pin_is_a_rewrite(world: dict[str, Path],
                                                      tmp_path: Path) -> None:
    """The attacker rolls back, then writes enough new events to pass the pinned seq."""
    pinned = json.loads(world["pin"].read_text())["seq"]
    _roll_back(world)
    other = make_repo(tmp_path / "other")
    from choir.ahdb import open_ahdb

    while open_ahdb().head()[0] <= pinned:
        attest(other, "lint", "true")
    proc = choir("audit", "--json", "--expect-head", str(world["pin"]))
    assert proc.returncode == 1 and _kinds(proc) == {"ahdb_anchor_mismatch"}, proc.stdout
    gate = choir("gate", "wi", "--repo", str(world["repo"]))
    assert gate.returncode == 1 and "rewritten" in gate.stdout, gate.stdout


def test_a_log_that_grew_honestly_passes_and_moves_the_mark(world: dict[str, Path],
                                                            tmp_path: Path) -> None:
    attest(make_repo(tmp_path / "other"), "lint", "true")
    assert choir("audit", "--expect-head", str(world["pin"])).returncode == 0
    assert choir("gate", "wi", "--repo", str(world["repo"])).returncode == 1  # demoted, no more
    marks = json.loads(Path(os.environ["CHOIR_SEEN_HEADS"]).read_text())
    from choir.ahdb import open_ahdb

    # the store's path and its log (its first event's hash), both at the head
    db = open_ahdb()
    assert {name: m["seq"] for name, m in marks.items()} == {
        db.identity(): db.head()[0], f"log:{db.first_hash()}": db.head()[0]}


def test_a_forged_or_broken_pin_is_refused(world: dict[str, Path], tmp_path: Path) -> None:
    forged = json.loads(world["pin"].read_text())
    forged["seq"] -= 1
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(forged))
    proc = choir("audit", "--json", "--expect-head", str(path))
    assert proc.returncode == 1 and _kinds(proc) == {"ahdb_anchor_signature"}, proc.stdout
    path.write_text("{not a head")
    bad = choir("audit", "--expect-head", str(path))
    assert bad.returncode == 2 and str(path) in bad.stderr and "fix:" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_ahdb_head_prints_the_head_the_audit_exports(world: dict[str, Path]) -> None:
    printed = json.loads(choir("ahdb", "head").stdout)
    assert printed == json.loads(world["pin"].read_text())


def test_the_gate_refuses_a_store_that_does_not_open(world: dict[str, Path]) -> None:
    for path in world["home"].glob("ahdb.sqlite*"):
        path.unlink()
    (world["home"] / "ahdb.sqlite").write_bytes(b"not a database" * 100)
    proc = choir("gate", "wi", "--repo", str(world["repo"]))
    assert proc.returncode == 1 and "cannot be opened" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr


def test_the_gate_refuses_the_old_log_wherever_it_is_put(world: dict[str, Path]) -> None:
    """Review 16e: the high-water mark was keyed by the store file's resolved path, so the
    old database moved to ``$CHOIR_HOME/old/`` behind a link at ``ahdb.sqlite`` was a
    store the gate had never seen: it opened, and recorded a fresh mark. The mark is also
    keyed by the log itself (its first event), wherever it is kept."""
    _roll_back(world)
    home = world["home"]
    (home / "old").mkdir()
    for part in list(home.glob("ahdb.sqlite*")):
        shutil.move(str(part), str(home / "old" / part.name))
    (home / "ahdb.sqlite").symlink_to("old/ahdb.sqlite")
    gate = choir("gate", "wi", "--repo", str(world["repo"]))
    assert gate.returncode == 1 and "rolled back" in gate.stdout, gate.stdout
