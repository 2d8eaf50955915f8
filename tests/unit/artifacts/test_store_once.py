"""Logs are stored once (issue #11 item 14): a one-step verifier's output is not written
twice (combined and per step), on the run folder's disk or in the object store."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from choir.evidence.artifacts import ArtifactStore
from choir.models import StepSpec, Target, VerifierKind, VerifierSpec
from choir.sandbox import get_sandbox
from choir.verification.pipeline import run_verifier

MIB = 1 << 20


def _disk_bytes(root: Path) -> int:
    """Bytes of file data under ``root``, each inode counted once (as ``du`` does)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            st = os.lstat(Path(dirpath) / name)
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def test_a_one_step_log_is_stored_once(tmp_path: Path) -> None:
    command = f"{sys.executable} -c \"import sys; sys.stdout.write('x' * {8 * MIB})\"; exit 1"
    spec = VerifierSpec(name="v", kind=VerifierKind.UNIT_TESTS, timeout_s=60,
                        steps=(StepSpec(name="run", command=command),))
    store = ArtifactStore(tmp_path / "store")
    result = run_verifier(spec, repo=tmp_path, sandbox=get_sandbox("local"), store=store,
                          run_id="once", target=Target(tree_hash="0" * 64))
    logs = result.run_dir / "logs"
    assert (logs / "combined.log").stat().st_size == 8 * MIB  # no header or note copied in
    assert result.artifacts["logs/combined.log"] == result.artifacts["logs/step-01-run.log"]
    assert _disk_bytes(tmp_path / "store") < 8 * MIB + MIB  # once, not twice
    assert result.manifest.commands_executed[0].exit_code == 1  # the command and exit code
    assert "[choir] step run failed: exit code 1" in result.tail_log  # are still shown
