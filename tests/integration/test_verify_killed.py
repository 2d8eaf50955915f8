"""``choir verify`` killed -9 mid-session, then ``choir audit``: a run that no attestation
names (still going, or killed before it sealed or was attested) is not evidence. The audit
lists it as dangling and stays clean, as git's fsck does with a dangling object; a run an
attestation names but whose record was changed or unlinked is still a violation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests import forked
from tests.integration.test_verify_cli import CALC_OK, CHOIR, make_repo, run, sandbox_name


def _audit() -> dict:  # type: ignore[type-arg]
    proc = run("audit", "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == (0 if out["ok"] else 1), proc.stderr
    return out  # type: ignore[no-any-return]


def _runs(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "artifacts" / "runs").iterdir())


def test_a_verify_killed_after_its_run_sealed_leaves_a_dangling_run_not_a_violation(
        tmp_path: Path, choir_home: Path) -> None:
    repo = make_repo(tmp_path / "repo", CALC_OK)
    env = {**os.environ, "CHOIR_FAILPOINT": "green:ran"}
    killed = forked.run([*CHOIR, "verify", "--repo", str(repo), "--sandbox",
                         sandbox_name(), "--mood", "CALM"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    sealed = _runs(choir_home)
    assert len(sealed) == 1 and (choir_home / "artifacts" / "runs" / sealed[0] /
                                 "manifest.json").is_file()
    out = _audit()
    assert out["ok"], out["violations"]
    assert out["dangling"] == sealed and out["counts"]["dangling_runs"] == 1
    again = run("verify", "--repo", str(repo), "--sandbox", sandbox_name(), "--mood", "CALM")
    assert again.returncode == 0, again.stderr
    out = _audit()
    assert out["ok"] and out["dangling"] == sealed, out


def _waiting(tmp_path: Path, choir_home: Path, seconds: int,
             **popen: Any) -> subprocess.Popen[str]:
    """``choir verify`` of a repo whose one step sleeps ``seconds``, once that step runs."""
    repo = make_repo(tmp_path / "repo", CALC_OK)
    (repo / "choir.yaml").write_text(
        "verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n"
        f"      - {{name: wait, command: 'sleep {seconds}'}}\n")
    proc = subprocess.Popen([*CHOIR, "verify", "--repo", str(repo), "--sandbox",
                             sandbox_name(), "--mood", "CALM"], stdout=subprocess.DEVNULL,
                            **popen)
    runs = choir_home / "artifacts" / "runs"
    deadline = time.monotonic() + 60
    while not (runs.is_dir() and any((p / "logs").is_dir() for p in runs.iterdir())):
        assert time.monotonic() < deadline, "the step never started"
        time.sleep(0.05)
    return proc


def test_a_verify_killed_mid_step_leaves_a_dangling_unsealed_run(
        tmp_path: Path, choir_home: Path) -> None:
    proc = _waiting(tmp_path, choir_home, 30, stderr=subprocess.DEVNULL,
                    start_new_session=True)
    runs = choir_home / "artifacts" / "runs"
    os.killpg(proc.pid, signal.SIGKILL)  # the session and its sandbox, as a crash would
    proc.wait()
    (unsealed,) = _runs(choir_home)
    assert not (runs / unsealed / "manifest.json").exists()
    out = _audit()
    assert out["ok"] and out["dangling"] == [unsealed], out


def test_an_attested_run_cannot_pass_for_dangling(tmp_path: Path, choir_home: Path) -> None:
    """Unlinking the attestation that names a run (to hide a FAIL, say) does not make the
    run dangling and the audit clean: the session record and the AHDB still name it."""
    repo = make_repo(tmp_path / "repo", CALC_OK)
    done = run("verify", "--repo", str(repo), "--sandbox", sandbox_name(), "--mood", "CALM",
               "--json")
    assert done.returncode == 0, done.stderr
    (att_id,) = json.loads(done.stdout)["attestations"]
    (choir_home / "attestations" / f"{att_id}.json").unlink()
    out = _audit()
    assert not out["ok"], out
    kinds = {v["kind"] for v in out["violations"]}
    # the AHDB's replay finds an outcome with no attestation; the session, a run it lists
    # with no attestation (named as the session folder it could not check)
    assert {"ahdb_rule", "run_unreadable"} <= kinds, kinds
    assert out["dangling"] == [r for r in _runs(choir_home) if r.endswith("-unit-0")], out


def test_the_next_verify_clears_the_temps_a_killed_one_left(
        tmp_path: Path, choir_home: Path) -> None:
    """A writer killed mid-write leaves its temp (an artifact streaming in, a run file, an
    attestation): the next ``choir verify`` removes each whose writer is gone once it is
    ten minutes old, and leaves a young one (its writer may live in another pid
    namespace)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    repo = make_repo(tmp_path / "repo", CALC_OK)
    tmp = choir_home / "artifacts" / "tmp"
    atts = choir_home / "attestations" / ".tmp"
    for folder in (tmp, atts):
        folder.mkdir(parents=True, exist_ok=True)
    then = time.time() - 700
    old = [tmp / f"w-{dead.pid}-1a", atts / f"a-{dead.pid}-2b"]
    for path in old:
        path.write_bytes(b"x" * 4096)
        os.utime(path, (then, then))
    young = tmp / f"w-{dead.pid}-3c"
    young.write_bytes(b"x")
    done = run("verify", "--repo", str(repo), "--sandbox", sandbox_name(), "--mood", "CALM")
    assert done.returncode == 0, done.stderr
    assert not any(p.exists() for p in old) and young.exists()
    assert _audit()["ok"]


def test_ctrl_c_stops_the_running_step_at_once(tmp_path: Path, choir_home: Path) -> None:
    """Review 16c: Ctrl-C printed ``choir: aborted`` and then waited for the step (its
    thread, joined at exit) to run to its end or its timeout; a ``choir run`` executor's
    change landed after the user gave up. The sandboxes are killed first now."""
    proc = _waiting(tmp_path, choir_home, 37, stderr=subprocess.PIPE, text=True,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.5)  # the step's sleep is running
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 10, "Ctrl-C waited for the step"
    assert proc.returncode == 1 and "aborted" in err
    left = subprocess.run(["pgrep", "-f", "sleep 37"], capture_output=True, text=True)
    assert left.stdout == "", "the step outlived the command"


def test_a_step_that_writes_names_no_record_can_hold_never_breaks_the_audit(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 16e: a step wrote ``$CHOIR_OUT`` names that are not UTF-8; they were stored
    replaced (U+FFFD) in the signed names and compared raw by the audit, so every ``choir
    audit`` after reported the run's files changed, and only deleting attested evidence
    made it clean again. Such an out folder is set aside like one over its bounds."""
    repo = make_repo(tmp_path / "repo", CALC_OK)
    (repo / "choir.yaml").write_text(
        "verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n"
        "      - {name: odd, command: 'printf x > \"$CHOIR_OUT/$(printf \"\\377\\376\")-x\"; "
        "mkdir \"$CHOIR_OUT/d$(printf \"\\377\")\"; printf y > \"$CHOIR_OUT/d$(printf "
        "\"\\377\")/y\"'}\n")
    verified = run("verify", "--repo", str(repo), "--sandbox", sandbox_name(), "--json")
    assert verified.returncode in (0, 1, 4), verified.stderr
    contract = json.loads(verified.stdout)
    assert contract["status"] != "PASS"  # set aside: not the evidence the step meant
    out = _audit()
    assert out["ok"], out
