"""Hostile paths are opened, never resolved: a planted symlink is never followed by Choir.

The executor and every verifier step write the trees Choir later reads on the host, as root,
with the signing key in reach. Each entry point that reads such a tree (the tree scan and
snapshot, the collection of ``$CHOIR_OUT``) is attacked here with a symlink planted as the
last component and as an intermediate folder, against a control showing that plain path
resolution would have followed it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import inspect_tree, snapshot
from choir.exceptions import IntegrityError
from tests import forked

SECRET = b"-----BEGIN PRIVATE KEY-----\nSECRET-hostile-paths\n-----END PRIVATE KEY-----\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                           *args], check=True, capture_output=True, text=True).stdout


def secret_home(tmp_path: Path) -> Path:
    keys = tmp_path / "home" / "keys"
    keys.mkdir(parents=True)
    (keys / "ed25519.key").write_bytes(SECRET)
    return keys


def every_byte(root: Path) -> bytes:
    """All bytes of every regular file under ``root`` (links not followed)."""
    found = b""
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink():
                found += path.read_bytes()
    return found


@pytest.mark.parametrize("where", ["lnk", "a/b/lnk"])
def test_a_symlinked_folder_staged_in_the_index_cannot_smuggle_a_file_into_the_snapshot(
        tmp_path: Path, where: str) -> None:
    """The key-theft attack: ``lnk/ed25519.key`` is staged, then ``lnk`` becomes a symlink
    to the key folder and is excluded. git still lists the staged path; the scan must not
    reach it through the link."""
    keys = secret_home(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("x = 1\n")
    git(repo, "init", "-q")
    staged = repo / where / "ed25519.key"
    staged.parent.mkdir(parents=True)
    staged.write_text("placeholder\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    shutil.rmtree(repo / where)
    os.symlink(keys, repo / where)
    (repo / ".git" / "info" / "exclude").write_text(f"/{where}\n")
    # the control: git lists the staged path, and resolving it lands on the key
    assert f"{where}/ed25519.key" in git(repo, "ls-files", "--cached")
    assert (repo / where / "ed25519.key").read_bytes() == SECRET
    snap = snapshot(repo, tmp_path / "snapshots")
    assert snap.path is not None
    assert SECRET not in every_byte(snap.path)
    assert not (snap.path / where / "ed25519.key").exists()
    assert (snap.path / "calc.py").read_text() == "x = 1\n"
    assert inspect_tree(repo).tree_hash == snap.tree_hash


STEAL = '''\
import os, pathlib, subprocess
# Choir masks CHOIR_HOME with an empty tmpfs: its mount point names the folder
masks = [line.split()[4] for line in open("/proc/self/mountinfo")
         if " - tmpfs " in line and line.split()[4] not in ("/tmp", "/dev", "/dev/shm")]
git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
with open(".git/info/exclude", "a") as fh:
    for n, mask in enumerate(masks):
        lnk = pathlib.Path(f"lnk{n}")
        lnk.mkdir()
        (lnk / "ed25519.key").write_text("placeholder")
        subprocess.run([*git, "add", f"lnk{n}/ed25519.key"], check=True)
        (lnk / "ed25519.key").unlink()
        lnk.rmdir()
        os.symlink(f"{mask}/keys", lnk)
        fh.write(f"/lnk{n}\\n")
pathlib.Path("test_loot.py").write_text(
    "import glob\\n"
    "def test_loot():\\n"
    "    for p in glob.glob('lnk*/ed25519.key'):\\n"
    "        print('LOOT', open(p, 'rb').read().hex())\\n"
    "    assert not glob.glob('lnk*/ed25519.key')\\n")
'''


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_sandboxed_executor_cannot_steal_the_key_through_a_staged_symlinked_folder(
        tmp_path: Path, choir_home: Path) -> None:
    """End to end: a command executor in bwrap learns CHOIR_HOME from its mount table,
    stages the key path and swaps in a symlinked folder; the verifier that runs next would
    print the key into its log (an artifact) and the feedback of the next attempt."""
    from choir.attest import load_signer
    from tests.workitems import PY, calc_repo

    load_signer()
    key = (choir_home / "keys" / "ed25519.key").read_bytes()
    repo = calc_repo(tmp_path / "repo", canary="CANARY-hostile-paths", sandbox="bwrap")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "buggy")
    (tmp_path / "steal.py").write_text(STEAL)
    item = tmp_path / "item.yaml"
    item.write_text(f"id: steal\ngoal: add must add\nrepo: ./repo\nmax_attempts: 1\n"
                    f"executor:\n  kind: command\n  command: {PY} {tmp_path / 'steal.py'}\n")
    proc = forked.run([PY, "-m", "choir", "run", str(item), "--json"],
                      capture_output=True, text=True, timeout=300)
    assert (repo / "test_loot.py").exists(), proc.stdout + proc.stderr  # the executor ran
    links = [p for p in repo.iterdir() if p.name.startswith("lnk")]
    assert any((p / "ed25519.key").exists() for p in links), "no plant reached the key"
    # review 25: the lines the executor added to .git/info/exclude are put back after its
    # sandbox ends, so its links are no longer hidden from the tree: the run refuses the
    # first one it meets (exit 2, naming it) before any verifier runs
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is a symlink to" in proc.stderr and "put back (.git/info/exclude)" in proc.stderr
    stored = every_byte(choir_home / "artifacts")
    assert key not in stored and key.hex().encode() not in stored, "the key reached a verifier"
    assert key.hex() not in proc.stdout + proc.stderr


def plant_out(store: ArtifactStore, run_id: str, keys: Path) -> Path:
    out = store.run_dir(run_id) / "out"
    out.mkdir(parents=True)
    (out / "junit.xml").write_text("<testsuite/>")
    os.symlink(keys / "ed25519.key", out / "key-file")
    os.symlink(keys, out / "key-folder")
    return out


def test_collecting_choir_out_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    keys = secret_home(tmp_path)
    store = ArtifactStore(tmp_path / "store")
    out = plant_out(store, "r1", keys)
    assert (out / "key-folder" / "ed25519.key").read_bytes() == SECRET  # the control
    files = store.seal_run("r1")
    assert set(files) == {"out/junit.xml"}
    assert not os.path.lexists(out / "key-file") and not os.path.lexists(out / "key-folder")
    assert SECRET not in every_byte(store.root)
    assert (keys / "ed25519.key").read_bytes() == SECRET


def test_a_folder_swapped_for_a_symlink_while_out_is_collected_is_not_followed(
        tmp_path: Path) -> None:
    """The race a leftover process runs: ``out/d`` is a real folder when it is listed and a
    symlink to the key folder when its files are read. (A race: on the old path-based walk it
    leaked in about half of the 6-second tries; the descriptor walk cannot.)"""
    keys = secret_home(tmp_path)
    store = ArtifactStore(tmp_path / "store")
    real = tmp_path / "real"
    stop = time.monotonic() + 6
    runs = 0

    def swap(out: Path, done: threading.Event) -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                os.rename(real, out / "d")
            with contextlib.suppress(OSError):
                os.rename(out / "d", real)
            with contextlib.suppress(OSError):
                os.symlink(keys, out / "d")
            with contextlib.suppress(OSError):
                os.unlink(out / "d")

    real.mkdir()
    (real / "ed25519.key").write_text("harmless")
    while time.monotonic() < stop:
        runs += 1
        out = store.run_dir(f"r{runs}") / "out"
        out.mkdir(parents=True)
        done = threading.Event()
        swapper = threading.Thread(target=swap, args=(out, done))
        swapper.start()
        try:
            for _ in range(200):
                with contextlib.suppress(OSError, IntegrityError):
                    store.seal_run(f"r{runs}")
        finally:
            done.set()
            swapper.join()
        if not real.exists():
            os.rename(out / "d", real)
        assert SECRET not in every_byte(store.root / "objects"), f"leaked on run {runs}"
