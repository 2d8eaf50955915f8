"""``choir.yaml`` is a file of the repo, so an executor may have planted what stands there.

Before: the trusted process opened ``repo/choir.yaml`` by path. A FIFO there (left by an
executor, ignored or not) hung ``choir verify`` forever before anything ran; a symlink led
the allowlist outside the tree being verified (git-ignored, so the tree scan, which refuses
a link out of the repo, never saw it), and the attestation named a tree whose ``choir.yaml``
says nothing of the verifiers that ran. Both watched on that code (the FIFO test timed out;
the linked file's verifier ran and PASSed). Now the file is opened from the repo's
folder without following a link and must be a regular file: exit 2, naming the file and
the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forked

OUTSIDE = """\
verifiers:
  outside:
    kind: unit_tests
    steps: [{name: t, command: "echo RAN-THE-OUTSIDE-CONFIG"}]
"""


def _verify(repo: Path) -> subprocess.CompletedProcess[str]:
    try:
        return forked.run([sys.executable, "-m", "choir", "verify", "--repo", str(repo),
                           "--sandbox", "local", "--json"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        pytest.fail("choir verify hung on the repo's choir.yaml")


def test_a_fifo_for_choir_yaml_is_refused_not_waited_on(tmp_path: Path,
                                                        choir_home: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    os.mkfifo(repo / "choir.yaml")
    proc = _verify(repo)
    assert proc.returncode == 2, proc.stderr
    assert f"{repo / 'choir.yaml'}" in proc.stderr and "regular file" in proc.stderr


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_a_symlinked_choir_yaml_is_refused(where: str, tmp_path: Path,
                                           choir_home: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    if where == "outside":  # an ignored link: the tree scan, which refuses such links, skips it
        (tmp_path / "outside.yaml").write_text(OUTSIDE)
        (repo / "choir.yaml").symlink_to(tmp_path / "outside.yaml")
        (repo / "f.txt").write_text("x\n")
        subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True)
        (repo / ".git" / "info" / "exclude").write_text("choir.yaml\n")
    else:
        (repo / "real.yaml").write_text(OUTSIDE)
        (repo / "choir.yaml").symlink_to("real.yaml")
    proc = _verify(repo)
    assert "RAN-THE-OUTSIDE-CONFIG" not in proc.stdout
    assert proc.returncode == 2, proc.stdout[-400:]
    assert f"{repo / 'choir.yaml'}" in proc.stderr and "symlink" in proc.stderr


def test_the_regular_file_still_loads(tmp_path: Path, choir_home: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(OUTSIDE)
    proc = _verify(repo)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "PASS"
