"""The key-theft plant against the real ``choir verify``: whatever the tree scan follows, the
key folder it reaches in a confined process is empty.

The executor stages ``lnk/ed25519.key`` in the git index, then makes ``lnk`` a symlink to
``$CHOIR_HOME/keys`` and excludes it. A tree scan that resolves the folder copies whatever
is there into the verifier's snapshot, and the step prints it into its log. The file-opening
helper closes that path on its own; this test pins the second, independent wall: the process
that scans trees never sees the key folder at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from choir.trusted.keyfile import load_key
from tests import forked

YAML = """\
verifiers:
  steal:
    kind: lint
    steps:
      - name: cat
        command: cat lnk/ed25519.key; ls -la lnk; true
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the mount-namespace level needs root")
def test_a_symlinked_key_folder_in_the_index_leaks_nothing(tmp_path: Path,
                                                          choir_home: Path) -> None:
    load_key(choir_home)  # a home that has signed before
    repo = tmp_path / "repo"
    (repo / "lnk").mkdir(parents=True)
    (repo / "choir.yaml").write_text(YAML)
    (repo / "lnk" / "ed25519.key").write_text("placeholder\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "plant")
    shutil.rmtree(repo / "lnk")
    (repo / "lnk").symlink_to(choir_home / "keys")
    (repo / ".git" / "info" / "exclude").write_text("lnk\n")
    sandbox = "bwrap" if shutil.which("bwrap") else "local"
    proc = forked.run([sys.executable, "-m", "choir", "verify", "--repo", str(repo),
                       "--sandbox", sandbox, "--json"], capture_output=True, text=True,
                      timeout=300, env=dict(os.environ))
    seen = proc.stdout + proc.stderr
    for path in (choir_home / "artifacts").rglob("*"):
        if path.is_file() and not path.is_symlink():
            seen += path.read_bytes().decode("latin-1")
    assert proc.returncode in (0, 1) and '"status"' in proc.stdout, proc.stderr  # it ran
    assert "PRIVATE KEY" not in seen, "the signing key reached the verifier"
