"""``choir approve`` answers only a run that waits for one.

Review 16c: ``choir approve TYPO`` crashed (``KeyError: 'work_item'``) after writing a
trace and a checkpoint for a run that never was, and every ``choir audit`` failed from then
on (a trace with none of a run's steps).
"""

from __future__ import annotations

from pathlib import Path

from tests import forked
from tests.workitems import PY


def test_approving_a_run_that_does_not_exist_changes_nothing(choir_home: Path) -> None:
    proc = forked.run([PY, "-m", "choir", "approve", "typo"], capture_output=True,
                      text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no run typo" in proc.stderr and "Traceback" not in proc.stderr
    assert [p.parent.name for p in choir_home.rglob("typo*")] in ([], ["locks"])  # no trace
    audit = forked.run([PY, "-m", "choir", "audit"], capture_output=True, text=True,
                       timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
