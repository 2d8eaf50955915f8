"""A folder Choir binds into a verifier's sandbox must never lead into Choir's own stores.

The attack: a SQLite postcondition resource lives in the repo (``db/app.sqlite``), so its
folder is bound read-only into every verifier's sandbox. An executor replaces ``db`` with a
symlink to ``$CHOIR_HOME/heldout`` (it learns the home from its mask's mount point) and
excludes it from git, so the tree scan never looks at it. The next ``choir verify`` or
``choir run`` resolved the folder and bound the held-out checks into every step, where the
code under test can read them and print them into a visible test's failure, which reaches
the executor's feedback in full: the held-out checks are fitted. The same bind reached the
artifact store (every held-out report's log) and, under Docker, whose engine binds host paths
outside Choir's mount namespace, the key folder (then only its mode stood in the way).
Watched on the code before the fix: the canary was printed under bwrap and under Docker.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forked
from tests.sandboxes import ISOLATED, isolated_backend

CANARY = "HELDOUT-CANARY-7f3a9c"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _repo(root: Path, target: Path) -> Path:
    repo = root / "repo"
    (repo / "db").mkdir(parents=True)
    sqlite3.connect(repo / "db" / "app.sqlite").close()
    (repo / "choir.yaml").write_text(f"""\
resources:
  store: {{sqlite: db/app.sqlite}}
verifiers:
  unit:
    kind: unit_tests
    steps:
      - name: peek
        command: cat {target}/secret.txt; ls {target}; true
""")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "base")
    # what the executor does: swap the folder for a link into Choir's home, hide it from git
    os.rename(repo / "db", root / "db-moved")
    (repo / "db").symlink_to(target)
    (repo / ".git" / "info" / "exclude").write_text("db\n")
    return repo


def _verify(repo: Path, backend: str) -> subprocess.CompletedProcess[str]:
    return forked.run([sys.executable, "-m", "choir", "verify", "--repo", str(repo),
                       "--sandbox", backend, "--json"], capture_output=True, text=True,
                      timeout=300, env=dict(os.environ))


@pytest.mark.parametrize("backend", ISOLATED)
@pytest.mark.parametrize("where", ["heldout", "artifacts"])
def test_a_resource_folder_swapped_for_a_link_into_choir_home_is_never_bound(
        backend: str, where: str, tmp_path: Path, choir_home: Path) -> None:
    isolated_backend(backend)
    target = choir_home / where
    target.mkdir(exist_ok=True)
    (target / "secret.txt").write_text(CANARY + "\n")
    repo = _repo(tmp_path, target)
    proc = _verify(repo, backend)
    assert CANARY not in proc.stdout + proc.stderr, "a step read a folder of Choir's home"
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
    assert str(repo / "choir.yaml") in proc.stderr and "db" in proc.stderr
    assert "CHOIR_HOME" in proc.stderr


@pytest.mark.parametrize("backend", ISOLATED)
def test_the_same_resource_as_a_real_folder_still_verifies(
        backend: str, tmp_path: Path, choir_home: Path) -> None:
    """The control: the resource folder, bound as before, when it is what it says it is."""
    isolated_backend(backend)
    repo = _repo(tmp_path, tmp_path / "elsewhere")
    (repo / "db").unlink()
    os.rename(tmp_path / "db-moved", repo / "db")
    proc = _verify(repo, backend)
    assert proc.returncode == 0, proc.stderr[-800:]
    assert json.loads(proc.stdout)["status"] == "PASS"


@pytest.mark.parametrize("backend", ISOLATED)
def test_a_resource_folder_swapped_for_a_link_anywhere_out_of_the_repo_is_never_bound(
        backend: str, tmp_path: Path, choir_home: Path) -> None:
    """The same link to any other folder (the user's ``~/.config``, another repo, a folder
    of sockets) was bound into every step: a review's step read a credentials file there,
    and one with the network off spoke to a host socket. A resource declared in the repo
    must be a folder of the repo."""
    isolated_backend(backend)
    target = tmp_path / "home" / ".config" / "cloud"
    target.mkdir(parents=True)
    (target / "secret.txt").write_text(CANARY + "\n")
    repo = _repo(tmp_path, target)
    proc = _verify(repo, backend)
    assert CANARY not in proc.stdout + proc.stderr, "a step read a folder out of the repo"
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
    assert "outside the repo" in proc.stderr


def test_a_bind_swapped_for_a_link_after_the_config_was_read_is_refused(
        tmp_path: Path, choir_home: Path) -> None:
    """Within a ``choir run`` the configuration is read before the executor, and each
    round's sandbox resolved the binds again after it: a swap made then was bound. A bind
    is pinned to its real path when ``choir.yaml`` is read; one that leads elsewhere when a
    sandbox opens is refused."""
    from choir.config import load_repo_config
    from choir.exceptions import ConfigError
    from choir.sandbox import resolve_sandbox
    from choir.verification import sandbox_options

    repo = _repo(tmp_path, tmp_path / "elsewhere")
    (repo / "db").unlink()
    os.rename(tmp_path / "db-moved", repo / "db")  # a real folder when the config is read
    config = load_repo_config(repo)
    resolve_sandbox("bwrap", **sandbox_options(config)).close()  # as read: bound
    os.rename(repo / "db", tmp_path / "db-again")  # the executor's swap, mid-run
    (tmp_path / "elsewhere").mkdir()
    (repo / "db").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="changed since"):
        resolve_sandbox("bwrap", **sandbox_options(config))
