"""The store of sealed files against the code Choir runs: a verifier step in every isolating
backend, an executor in its sandbox, and an executor in trust mode (unsandboxed, the
caller's uid), which can write the store and must be caught when the next round reads it.

A sealed file is shared by every tree that holds its bytes, so one write through a link
would reach later rounds: these tests try every way a step or an executor has to make one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import blake3
import pytest

from choir.evidence.tree import _holds, inspect_tree, remove_snapshot, snapshot
from choir.models import Limits
from choir.sandbox import Sandbox
from tests import forked
from tests.sandboxes import ISOLATED, isolated_backend
from tests.workitems import BUGGY, FIXED, PY, calc_repo

CANARY = "CANARY-store"


@pytest.fixture(params=ISOLATED)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return isolated_backend(request.param)  # type: ignore[no-any-return]


def store_of(home: Path) -> Path:
    return home / "artifacts" / "trees"


def objects_hold_their_names(store: Path) -> list[Path]:
    """The store's objects whose bytes no longer hash to their names (none, when intact)."""
    return [p for p in (store / "objects").rglob("*") if p.is_file()
            and blake3.blake3(p.read_bytes()).hexdigest() != p.name]


def git_repo(path: Path, sandbox: str = "bwrap") -> Path:
    calc_repo(path, canary=CANARY, sandbox=sandbox)
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "buggy")):
        subprocess.run(["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t",
                        *args], check=True, capture_output=True)
    return path


ATTACK = ("chmod u+w calc.py; echo forged >> calc.py; printf 'x' | dd of=calc.py "
          "conv=notrunc 2>/dev/null; ln calc.py $CHOIR_OUT/hard; ln calc.py /tmp/hard; "
          "touch planted.py; mv calc.py moved.py; rm -f test_calc.py; "
          "cat calc.py > $CHOIR_OUT/seen; true")


def test_a_step_cannot_change_a_shared_file(sandbox: Sandbox, tmp_path: Path,
                                            choir_home: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    root = tmp_path / "snaps"
    first = snapshot(repo, root)
    assert first.path is not None
    os.chmod(tmp_path, 0o755)  # the step runs as nobody: the tree must be reachable
    chunks: list[bytes] = []
    result = sandbox.exec(ATTACK, repo=first.path, out_dir=tmp_path / "out", env={},
                          timeout_s=60, limits=Limits(), network=False, sink=chunks.append)
    assert result.infra_error is None, result.infra_error
    assert (tmp_path / "out" / "seen").read_text() == BUGGY  # it ran, and read the file
    assert not (tmp_path / "out" / "hard").exists()  # no link out of the read-only tree
    assert _holds(first.path, first.tree_hash, full=True)  # the lent tree is intact
    assert objects_hold_their_names(store_of(choir_home)) == []
    remove_snapshot(root)
    again = snapshot(repo, root)  # built on the parked tree the step had in front of it
    assert again.path is not None and again.tree_hash == first.tree_hash
    assert (again.path / "calc.py").read_text() == BUGGY
    assert not (again.path / "planted.py").exists()


HOSTILE = '''\
import pathlib, sys
objects = pathlib.Path({objects!r})
try:
    found = [p for p in objects.rglob("*") if p.is_file()]
    for obj in found:
        data = obj.read_bytes()
        if data == {buggy!r}:
            obj.chmod(0o644)
            obj.write_bytes({fixed!r})  # the same size: the verifiers would see the fix
            obj.chmod(0o444)
            print("STORE-WRITTEN", obj)
    print("STORE-FOUND", len(found))
except OSError as exc:
    print("STORE-UNREACHABLE", exc)
'''


def _run(tmp_path: Path, item_id: str, sandbox: str,
         home: Path) -> tuple[dict[str, object], str]:
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE.format(objects=str(store_of(home) / "objects"),
                                     buggy=BUGGY.encode(), fixed=FIXED.encode()))
    item = tmp_path / "item.yaml"
    item.write_text(f"id: {item_id}\ngoal: add must add\nrepo: ./repo\nmax_attempts: 1\n"
                    f"executor:\n  kind: command\n  command: {PY} {script}\n"
                    f"  sandbox: {sandbox}\n")
    proc = forked.run([PY, "-m", "choir", "run", str(item), "--json"],
                      capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    logs = b"".join(p.read_bytes() for p in (home / "artifacts").rglob("*")
                    if p.is_file() and b"STORE-" in p.read_bytes()[:100000])
    return json.loads(proc.stdout), logs.decode("utf-8", "replace")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_sandboxed_executor_cannot_reach_the_store(tmp_path: Path, choir_home: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    verified = forked.run([PY, "-m", "choir", "verify", "--repo", str(repo), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert json.loads(verified.stdout)["status"] == "FAIL", verified.stderr
    before = {p: p.read_bytes() for p in (store_of(choir_home) / "objects").rglob("*")
              if p.is_file()}
    assert any(data == BUGGY.encode() for data in before.values())
    out, logs = _run(tmp_path, "reach-store", "bwrap", choir_home)
    assert "STORE-UNREACHABLE" in logs or "STORE-FOUND 0" in logs, logs[-2000:]
    assert "STORE-WRITTEN" not in logs
    assert out["status"] != "asserted"
    for path, data in before.items():
        assert not path.exists() or path.read_bytes() == data
    assert objects_hold_their_names(store_of(choir_home)) == []


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_store_written_by_a_trust_mode_executor_is_caught_by_the_next_round(
        tmp_path: Path, choir_home: Path) -> None:
    """Unsandboxed, the executor is the caller: it finds the sealed buggy calc.py and writes
    the fix into it, leaving the live tree buggy. Had the round linked that object, its
    verifier would have passed a tree whose hash names the buggy bytes."""
    repo = git_repo(tmp_path / "repo")
    verified = forked.run([PY, "-m", "choir", "verify", "--repo", str(repo), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert json.loads(verified.stdout)["status"] == "FAIL", verified.stderr
    out, logs = _run(tmp_path, "trust-store", "none", choir_home)
    assert "STORE-WRITTEN" in logs, logs[-2000:]  # the control: the caller's uid can write it
    assert out["status"] != "asserted", out
    assert (repo / "calc.py").read_text() == BUGGY
    atts = [json.loads(p.read_text()) for p in (choir_home / "attestations").rglob("*.json")]
    run_atts = [a for a in atts if a["body"]["target"].get("work_item") == "trust-store"]
    assert run_atts and all(a["body"]["result"] != "PASS" for a in run_atts)
    assert {a["body"]["target"]["tree_hash"] for a in run_atts} == {inspect_tree(repo).tree_hash}
    # the written object is never linked again: a fresh round reads the buggy bytes
    snap = snapshot(repo, tmp_path / "snaps")
    assert snap.path is not None and (snap.path / "calc.py").read_text() == BUGGY


def test_a_step_sees_the_sealed_modes(tmp_path: Path) -> None:
    """What the verifiers see of the store: 0444 files, 0555 folders, owned by the caller."""
    repo = git_repo(tmp_path / "repo")
    snap = snapshot(repo, tmp_path / "snaps")
    assert snap.path is not None
    listing = subprocess.run(["find", str(snap.path), "-printf", "%m %u %y %P\n"],
                             capture_output=True, text=True, check=True).stdout
    for line in listing.splitlines():
        mode, _owner, kind, *_ = line.split(" ")
        assert (kind, mode) in (("f", "444"), ("f", "555"), ("d", "555"), ("l", "777")), line


LINTED = """\
verifiers:
  unit:
    kind: unit_tests
    steps:
      - {name: present, command: 'test -f calc.py'}
  lint:
    kind: lint
    steps:
      - name: unused-imports
        command: "sleep 3; if grep -q 'import os' calc.py; then echo unused; exit 1; fi"
sandbox: {backend: bwrap}
"""


def _spec_view_in(folder: Path) -> bool:
    """Whether a run's spec view (``*.spec-*``) is below ``folder``, which the runs write
    into as it is read: a temp folder removed mid-walk is skipped, not an error."""
    # os.walk skips a folder that vanished; rglob raised FileNotFoundError (a flaky test)
    return any(".spec-" in name for _top, dirs, _files in os.walk(folder) for name in dirs)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_run_that_ends_never_takes_the_tree_another_run_verifies(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 16b: two runs of one tree (two work items on one base, a plan's items, two
    clones) shared ``snapshots/<tree hash>`` and its spec view. The run that ended first
    parked the tree and removed the view while the other's linter slept in it; the linter
    then read an empty folder, PASSed, and the gate opened for a tree it fails. Each run
    has its own folder now: the linter reads the file and FAILs."""
    for name in ("one", "two"):
        repo = tmp_path / name / "repo"
        repo.mkdir(parents=True)
        (repo / "calc.py").write_text("import os\n\n" + FIXED)
        (repo / "choir.yaml").write_text(LINTED)
    def item(name: str, extra: str) -> list[str]:
        path = tmp_path / name / "item.yaml"
        path.write_text(f"id: {name}\ngoal: keep calc\nrepo: ./repo\nmax_attempts: 1\n"
                        f"executor: {{kind: command, command: 'true'}}\n{extra}")
        return [PY, "-m", "choir", "run", str(path), "--mood", "CALM", "--json"]
    linted = subprocess.Popen(item("two", "required_verifiers: [lint]\n"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        views = choir_home / "artifacts" / "snapshots"
        for _ in range(300):  # the linted run's view is built: its linter is about to sleep
            if _spec_view_in(views) or linted.poll() is not None:
                break
            subprocess.run(["sleep", "0.05"])
        quick = subprocess.run(item("one", ""), capture_output=True, text=True, timeout=300)
        assert json.loads(quick.stdout)["status"] == "asserted", quick.stderr[-2000:]
        out, err = linted.communicate(timeout=300)
    finally:
        if linted.poll() is None:
            linted.kill()
            linted.communicate()
    assert json.loads(out)["status"] != "asserted", err[-2000:]
    gate = forked.run([PY, "-m", "choir", "gate", "two", "--repo",
                       str(tmp_path / "two" / "repo")], capture_output=True, text=True)
    assert gate.returncode == 1, gate.stdout


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_run_removes_its_folder_while_it_still_holds_its_lease(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 16g: the run's snapshot folder was removed after its lease was released, so
    a ``choir approve`` that had waited for the lease verified in the folder as it was
    emptied (a linter read nothing and PASSed). Removal happens under the lease now."""
    import asyncio
    import errno
    import fcntl

    import choir.graph.runner as runner
    from tests.workitems import fixing_item

    git_repo(tmp_path / "repo")
    held: list[bool] = []
    real = runner.remove_snapshot

    def removing(path: Path) -> None:
        fd = os.open(choir_home / "locks" / f"{path.name}.lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except OSError as exc:
            held.append(exc.errno == errno.EWOULDBLOCK)
        finally:
            os.close(fd)
        real(path)

    monkeypatch.setattr(runner, "remove_snapshot", removing)
    outcome = asyncio.run(runner.run_work_item(fixing_item(tmp_path), run_id="leased"))
    assert outcome.status in ("asserted", "halted"), outcome.events
    assert held == [True]
