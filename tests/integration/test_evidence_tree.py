"""Issue #11: the tree a verifier sees is exactly the tree its evidence names.

Attacks through the real CLI and a real bubblewrap sandbox: an ignored ``conftest.py`` that
patches the code under test, a stale ignored ``.pyc``, a leftover process swapping a file in
while the verifier runs, and ``gate`` / ``--commit`` on trees that were never verified.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import py_compile
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import forked
from tests.workitems import BUGGY, FIXED, PY, calc_repo

CANARY = "CANARY-evidence-tree"
PATCH = "import calc\ncalc.add = lambda a, b: a + b\n"


def choir(*args: str, cwd: Path | None = None, timeout: float = 300,
          **extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **extra)
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      cwd=cwd, env=env, timeout=timeout)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                           *args], check=True, capture_output=True, text=True).stdout


def git_repo(path: Path) -> Path:
    calc_repo(path, canary=CANARY, sandbox="bwrap")
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "buggy")
    return path


def manifest_bytes(repo: Path) -> bytes:
    """The tree's canonical manifest, as a user hands it to a sha256-only tool."""
    return subprocess.run([PY, "-c", "import sys, pathlib; "
                           "from choir.evidence.tree import tree_manifest;"
                           f" sys.stdout.buffer.write(tree_manifest(pathlib.Path({str(repo)!r})))"],
                          capture_output=True, check=True).stdout


def verify(repo: Path) -> dict[str, object]:
    proc = choir("verify", "--repo", str(repo), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def test_an_ignored_conftest_cannot_patch_the_code_under_test(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / ".git" / "info" / "exclude").write_text("conftest.py\n")
    (repo / "conftest.py").write_text(PATCH)
    out = verify(repo)
    # the clean clone (same tree hash) fails; so must the tree with the hidden file
    assert out["status"] == "FAIL", out["summary"]
    assert (repo / "conftest.py").read_text() == PATCH  # the live tree is untouched


def test_a_stale_ignored_pyc_cannot_stand_in_for_the_source(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore caches")
    source = repo / "calc.py"
    source.write_text(FIXED)  # same size as BUGGY: the pyc header then matches both
    stamp = source.stat().st_mtime
    py_compile.compile(str(source), cfile=str(repo / "__pycache__" /
                       f"calc.{sys.implementation.cache_tag}.pyc"))
    source.write_text(BUGGY)
    os.utime(source, (stamp, stamp))
    assert git(repo, "status", "--porcelain") == ""
    out = verify(repo)
    assert out["status"] == "FAIL", out["summary"]


def test_a_leftover_process_cannot_swap_the_fix_in_while_verifiers_run(
        tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    runs = tmp_path / "choir-home" / "artifacts" / "runs"
    swapper = subprocess.Popen([PY, "-c", textwrap.dedent(f"""\
        import os, pathlib, time
        runs, calc = pathlib.Path({str(runs)!r}), pathlib.Path({str(repo / "calc.py")!r})
        end = time.monotonic() + 60
        while time.monotonic() < end and not (runs.is_dir() and any(runs.iterdir())):
            time.sleep(0.005)
        calc.write_text({FIXED!r})      # the verifier has started: swap the fix in
        time.sleep(8)
        calc.write_text({BUGGY!r})      # and back, before anyone looks again
        """)], start_new_session=True)
    try:
        out = verify(repo)
    finally:
        swapper.wait(timeout=30)
    assert (repo / "calc.py").read_text() == BUGGY
    manifest = out["manifest"]
    assert isinstance(manifest, dict)
    buggy = subprocess.run([PY, "-c", f"from choir.evidence.tree import tree_hash; import pathlib; "
                            f"print(tree_hash(pathlib.Path({str(repo)!r})))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert manifest["tree_hash"] == buggy
    assert out["status"] == "FAIL", "the buggy tree's hash was verified as PASS"


def test_verify_leaves_no_snapshot_behind(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / "calc.py").write_text(FIXED)
    assert verify(repo)["status"] == "PASS"
    snapshots = tmp_path / "choir-home" / "artifacts" / "snapshots"
    assert not snapshots.exists() or list(snapshots.iterdir()) == []


def test_commit_is_recorded_only_for_a_clean_tree(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / "calc.py").write_text(FIXED)  # uncommitted fix
    head = git(repo, "rev-parse", "HEAD").strip()
    out = verify(repo)
    assert out["status"] == "PASS"
    manifest = out["manifest"]
    assert isinstance(manifest, dict)
    assert manifest["commit_sha"] is None  # HEAD is the buggy commit: it was never verified
    [att_id] = out["attestations"]  # type: ignore[misc]
    shown = choir("attest", "show", att_id, "--in-toto")
    stmt = json.loads(base64.b64decode(json.loads(shown.stdout)["payload"]))
    tree_subject = stmt["subject"][0]["digest"]
    assert "gitCommit" not in tree_subject  # a dirty tree names no commit
    assert tree_subject["sha256"] == hashlib.sha256(manifest_bytes(repo)).hexdigest()
    git(repo, "commit", "-qam", "fix")
    fixed = git(repo, "rev-parse", "HEAD").strip()
    manifest = verify(repo)["manifest"]
    assert isinstance(manifest, dict)
    assert manifest["commit_sha"] == fixed != head


def _asserted_run(tmp_path: Path) -> Path:
    repo = git_repo(tmp_path / "repo")
    (tmp_path / "fix.py").write_text(
        f"import pathlib\npathlib.Path('calc.py').write_text({FIXED!r})\n")
    item = tmp_path / "item.yaml"
    item.write_text(f"id: fix-add\ngoal: add must add\nrepo: ./repo\nexecutor:\n"
                    f"  kind: command\n  command: {PY} {tmp_path / 'fix.py'}\n")
    proc = choir("run", str(item), "--run-id", "r1", "--json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return repo


@pytest.mark.slow  # a whole run or two: CI's slow stage
def test_gate_without_repo_checks_the_current_directory_tree(tmp_path: Path) -> None:
    repo = _asserted_run(tmp_path)
    ok = choir("gate", "fix-add", cwd=repo)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    signer = json.loads(next((tmp_path / "choir-home" / "attestations").rglob("*.json"))
                        .read_text())["signer_key_id"]
    assert f"signed by key {signer}" in ok.stdout and "trusted keys" in ok.stdout
    # a pin that does not name the signer: the same ASSERT no longer opens the gate
    pinned = choir("gate", "fix-add", cwd=repo, CHOIR_TRUSTED_KEYS="0" * 32)
    # refused at the log already: no head of it is signed by a pinned key (the gate answers
    # from the signed log, review 12), before any attestation is looked at
    assert pinned.returncode == 1 and "not covered by a trusted signed head" in pinned.stdout
    assert signer in pinned.stdout
    assert choir("gate", "fix-add", cwd=repo, CHOIR_TRUSTED_KEYS=signer).returncode == 0
    audited = choir("audit")
    assert audited.returncode == 0 and f"signed by key {signer} (" in audited.stdout
    keys = json.loads(choir("audit", "--json").stdout)["keys"]
    assert signer in keys["signers"] and keys["trusted"] == [signer]
    for name in ("ed25519.key", "ed25519.pub"):  # the key pair is swapped behind our back
        (tmp_path / "choir-home" / "keys" / name).unlink()
    subprocess.run([PY, "-c", "from choir.attest import load_signer; load_signer()"], check=True)
    swapped = choir("audit")
    assert swapped.returncode == 1 and "VIOLATION signer_not_pinned" in swapped.stdout
    (repo / "calc.py").write_text(BUGGY)  # changed after the ASSERT
    assert choir("gate", "fix-add", cwd=repo).returncode == 1
    # the uncommitted fix was verified, HEAD (buggy) never was
    head = git(repo, "rev-parse", "HEAD").strip()
    assert choir("gate", "fix-add", "--commit", head, cwd=repo).returncode == 1
    unknown = choir("gate", "fix-add", "--commit", "f" * 40, cwd=repo)
    assert unknown.returncode == 2 and "fix:" in unknown.stderr
    (repo / "calc.py").write_text(FIXED)
    git(repo, "commit", "-qam", "the verified fix")  # now a commit holds exactly that tree
    assert choir("gate", "fix-add", "--commit", "HEAD", cwd=repo).returncode == 0
    git(repo, "reset", "-q", "--hard", head)  # back to the buggy commit
    assert choir("gate", "fix-add", "--commit", head, "--repo", str(repo)).returncode == 1
    nowhere = tmp_path / "empty"
    nowhere.mkdir()
    refused = choir("gate", "fix-add", cwd=nowhere)
    assert refused.returncode == 2 and "fix:" in (refused.stdout + refused.stderr)


def test_an_ignored_conftest_written_by_the_executor_does_not_assert(tmp_path: Path) -> None:
    git_repo(tmp_path / "repo")
    (tmp_path / "cheat.py").write_text(textwrap.dedent(f"""\
        import pathlib
        pathlib.Path('.git/info/exclude').write_text('conftest.py\\n')
        pathlib.Path('conftest.py').write_text({PATCH!r})
        """))
    item = tmp_path / "item.yaml"
    item.write_text(f"id: cheat\ngoal: add must add\nrepo: ./repo\nmax_attempts: 1\n"
                    f"executor:\n  kind: command\n  command: {PY} {tmp_path / 'cheat.py'}\n")
    proc = choir("run", str(item), "--run-id", "cheat1", "--json")
    assert proc.returncode == 1, proc.stdout
    assert json.loads(proc.stdout)["status"] != "asserted"
    snapshots = tmp_path / "choir-home" / "artifacts" / "snapshots"
    assert not snapshots.exists() or list(snapshots.iterdir()) == []


@pytest.mark.slow
def test_a_resumed_round_never_verifies_a_tree_that_changed_after_the_crash(
        tmp_path: Path) -> None:
    """kill -9 while the verifier runs; the tree changes; the resumed round must not ASSERT."""
    repo = git_repo(tmp_path / "repo")
    (repo / "test_calc.py").write_text(
        "import time\nfrom calc import add\n\ndef test_add():\n    time.sleep(3)\n"
        "    assert add(2, 3) == 5\n")
    (tmp_path / "noop.py").write_text("")
    item = tmp_path / "item.yaml"
    item.write_text(f"id: fix-add\ngoal: add must add\nrepo: ./repo\nmax_attempts: 1\n"
                    f"executor:\n  kind: command\n  command: {PY} {tmp_path / 'noop.py'}\n")
    buggy = subprocess.run([PY, "-c", f"from choir.evidence.tree import tree_hash; import pathlib; "
                            f"print(tree_hash(pathlib.Path({str(repo)!r})))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen([PY, "-m", "choir", "run", str(item), "--run-id", "k1", "--json"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    runs = tmp_path / "choir-home" / "artifacts" / "runs"
    deadline = time.monotonic() + 120
    while not (runs.is_dir() and any(runs.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)  # the verifier is inside its 3 s test
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    snapshots = tmp_path / "choir-home" / "artifacts" / "snapshots"
    subprocess.run(["rm", "-rf", str(snapshots)], check=True)  # lost with the crash
    (repo / "calc.py").write_text(FIXED)  # the tree changes before the resume
    resumed = choir("run", "--resume", "k1", "--json")
    out = json.loads(resumed.stdout)
    assert out["status"] != "asserted", out
    assert choir("gate", "fix-add", "--repo", str(repo)).returncode == 1
    (repo / "calc.py").write_text(BUGGY)
    assert tree_of(repo) == buggy
    assert choir("gate", "fix-add", "--repo", str(repo)).returncode == 1


def tree_of(repo: Path) -> str:
    return subprocess.run([PY, "-c", f"from choir.evidence.tree import tree_hash; import pathlib; "
                           f"print(tree_hash(pathlib.Path({str(repo)!r})))"],
                          capture_output=True, text=True, check=True).stdout.strip()
