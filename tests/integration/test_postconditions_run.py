"""``choir run`` with a decision type: above its blast radius the postconditions are required
before anything is ASSERTed, and their drift reaches the run's events and the AHDB."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.graph.runner import run_work_item
from choir.models import AtomKind
from tests.postcondition_systems import flag_db
from tests.sandboxes import isolated_backend

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

SET_FLAG = """\
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
if sys.argv[2] == "write":
    con.execute("UPDATE flags SET value = 'on' WHERE name = 'beta'")
con.commit()
"""


def _setup(tmp_path: Path, *, mode: str, radius: str, on_red: str = "continue") -> Path:
    isolated_backend("bwrap")
    db = flag_db(tmp_path / "system", {"beta": "off"})
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("the flag service\n")
    (repo / "choir.yaml").write_text(textwrap.dedent(f"""\
        resources:
          flags: {{sqlite: {db}}}
        verifiers:
          smoke:
            kind: smoke
            steps: [{{name: ok, command: "true"}}]
          flag_set:
            read_after_write:
              resource: flags
              sql: SELECT value FROM flags WHERE name = :name
              expect_from: value
              verify_timeout_ms: {300 if mode == "late" else 1000}
        decisions:
          set_flag:
            verification:
              required_above_blast_radius: small
              methods: [flag_set]
              on_red_drift: {on_red}
        moods:
          CALM: {{verifiers: [smoke]}}
        sandbox: {{backend: bwrap}}
        """))
    (tmp_path / "act.py").write_text(SET_FLAG)
    if mode == "late":  # the action's write never lands in time: the row is not there
        con = sqlite3.connect(db)
        con.execute("DELETE FROM flags WHERE name = 'beta'")
        con.commit()
        con.close()
    item = tmp_path / "item.yaml"
    act = f"{sys.executable} {tmp_path / 'act.py'} {db} {'write' if mode == 'write' else 'lose'}"
    item.write_text(textwrap.dedent(f"""\
        id: flip-beta
        goal: turn the beta flag on
        repo: ./repo
        max_attempts: 1
        decision_type: set_flag
        blast_radius: {radius}
        action: {{name: beta, value: "on"}}
        executor:
          kind: command
          sandbox: none
          command: {act}
        """))
    return item


def _atoms(kind: AtomKind) -> list[str]:
    return [a.claim for a in open_ahdb().atoms("flip-beta", kind)]


def test_required_postcondition_passes_and_the_item_is_asserted(tmp_path: Path) -> None:
    outcome = asyncio.run(run_work_item(_setup(tmp_path, mode="write", radius="medium")))
    assert outcome.status == "asserted", outcome.reason
    assert any("flag_set" in a.required_verifiers
               for a in open_ahdb().atoms("flip-beta", AtomKind.ASSERT))
    assert not any("drift" in e for e in outcome.events)


def test_lost_write_blocks_assert_with_yellow_drift(tmp_path: Path) -> None:
    outcome = asyncio.run(run_work_item(_setup(tmp_path, mode="lose", radius="medium")))
    assert outcome.status != "asserted"
    assert open_ahdb().is_asserted("flip-beta") is None
    assert any("drift verify yellow: flag_set" in e for e in outcome.events)
    assert any("drift verify yellow: flag_set" in c for c in _atoms(AtomKind.HYPOTHESIZE))
    # the action's sealed record lists the outcome, and the audit re-derives it
    from choir.audit.integrity import audit
    from choir.evidence.artifacts import ArtifactStore

    record = ArtifactStore().run_dir(f"{outcome.run_id}-r0") / "manifest.json"
    entries = json.loads(record.read_text())["verification"]
    assert [(e["verifier"], e["outcome"], e["severity"]) for e in entries] == [
        ("flag_set", "fail", "yellow")]
    assert audit().ok


def test_below_the_threshold_the_method_is_not_required(tmp_path: Path) -> None:
    outcome = asyncio.run(run_work_item(_setup(tmp_path, mode="lose", radius="small")))
    assert outcome.status == "asserted"  # only the mood's smoke verifier ran
    assert not any("drift" in e for e in outcome.events)


def test_late_write_is_red_drift_and_the_policy_halts(tmp_path: Path) -> None:
    outcome = asyncio.run(run_work_item(_setup(tmp_path, mode="late", radius="medium",
                                               on_red="halt")))
    assert outcome.status == "halted"
    assert "red drift on flag_set" in outcome.reason
    assert open_ahdb().is_asserted("flip-beta") is None
    assert any("drift verify red: flag_set" in c for c in _atoms(AtomKind.HYPERTHESIS))
