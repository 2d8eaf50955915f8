"""The repo's own .venv is the interpreter a step runs, even though verifiers read a snapshot
of the hashed files (which never holds an untracked .venv). Seen on a real project (toolz):
the snapshot had no .venv, so the step fell back to the system Python and its plugins."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from choir.app.verify import verify_tree
from choir.models import Mood

pytestmark = pytest.mark.skipif(not shutil.which("bwrap") and not os.environ.get("CI"),
                                reason="bubblewrap is not installed")


def test_a_step_runs_the_repos_own_venv_not_the_snapshots_fallback(tmp_path: Path,
                                                                   monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    repo = tmp_path / "proj"
    repo.mkdir()
    base = os.path.realpath(sys.base_prefix) + "/bin/python3"
    subprocess.run([base, "-m", "venv", "--without-pip", str(repo / ".venv")], check=True)
    (repo / ".gitignore").write_text(".venv/\n")
    (repo / "choir.yaml").write_text(textwrap.dedent("""\
        verifiers:
          which:
            kind: smoke
            steps:
              - name: prefix
                command: python3 -c "import sys; assert sys.prefix.endswith('/.venv'), sys.prefix"
    """))
    outcome = verify_tree(repo, mood=Mood.CALM, sandbox_name="bwrap")
    assert outcome.contract["status"] == "PASS", outcome.contract["tail_log"][-1000:]
