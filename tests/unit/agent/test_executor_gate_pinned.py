"""Issue #11 item 13: the llm executor's own gate verifies with the run's pinned configuration
and current mood, and every check it runs is attested (so ``choir audit`` accounts for it)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from choir.agent.executor import ChangeSummary, green_verifier
from choir.attest import AttestationStore
from choir.audit import audit
from choir.config import load_repo_config
from choir.config.policy import load_policy
from choir.exceptions import VerificationRejected
from choir.executors.pinned import pinned_gate
from choir.models import Mood, WorkItem
from tests.workitems import calc_repo


def test_a_rewritten_choir_yaml_does_not_weaken_the_agents_gate(
        tmp_path: Path, choir_home: Path) -> None:
    repo = calc_repo(tmp_path / "repo", canary="c", sandbox="local")
    config = load_repo_config(repo)  # pinned when the run started: unit runs pytest
    (repo / "choir.yaml").write_text(  # the agent's edit: a gate that always passes
        "verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n"
        "      - {name: pytest, command: 'true'}\nsandbox: {backend: local}\n")
    item = WorkItem(id="wi", goal="g", repo=str(repo))
    with pinned_gate(config, load_policy(config), Mood.CURIOUS):
        verify = green_verifier(item, "run1-exec1")
    with pytest.raises(VerificationRejected):
        asyncio.run(verify(ChangeSummary(summary="fixed")))
    store = AttestationStore()
    (att,) = [store.get(i) for i in store.ids()]
    assert att.body.lens == "executor_gate" and att.body.mood == "CURIOUS"
    assert att.body.result.value == "FAIL" and att.body.commands[0].endswith(
        "--junitxml=$CHOIR_OUT/junit.xml")
    result = audit()
    assert result.ok, result.violations


def test_the_llm_executors_tools_never_reach_choirs_home_inside_the_repo(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With CHOIR_HOME inside the repo (ignored, as a .venv is), the command executor's
    sandbox masks it; the llm executor's file tools listed, read and wrote it: a held-out
    test reached the model, and ``trusted_keys`` was rewritten (a review's finding, failing
    on the old code). Choir's home, its artifact store and every held-out folder are now
    invisible to the tools, as they are to a sandboxed executor."""
    from choir.agent.executor import build_agent
    from choir.agent.files import ToolInputError

    repo = calc_repo(tmp_path / "repo", canary="x")
    home = repo / ".choir"
    monkeypatch.setenv("CHOIR_HOME", str(home))
    monkeypatch.delenv("CHOIR_ARTIFACT_DIR", raising=False)
    (home / "heldout" / "calc").mkdir(parents=True)
    (home / "heldout" / "calc" / "test_hidden.py").write_text("# SECRET-HELDOUT\n")
    (home / "artifacts" / "objects").mkdir(parents=True)
    (home / "artifacts" / "objects" / "rawlog").write_text("CANARY-RAW\n")
    (home / "trusted_keys").write_text("ddc56ceb08fc20f3a03b1e1bc7ff6454\n")
    (repo / "into-home").symlink_to(home)
    item = WorkItem(id="fix-add", goal="g", repo=str(repo),
                    executor={"kind": "llm", "model": "x"})  # type: ignore[arg-type]
    _, files = build_agent(item, "run-exec1", model="openai/x")
    listed = files.list_files(".")
    assert ".choir/" not in listed and "test_hidden" not in files.search("SECRET"), listed
    for path in (".choir/heldout/calc/test_hidden.py", ".choir/artifacts/objects/rawlog",
                 "into-home/trusted_keys"):
        with pytest.raises(ToolInputError, match="Choir's own"):
            files.read_file(path)
    with pytest.raises(ToolInputError, match="Choir's own"):
        files.write_file(".choir/trusted_keys", "ffffffffffffffffffffffffffffffff\n")
    assert (home / "trusted_keys").read_text() == "ddc56ceb08fc20f3a03b1e1bc7ff6454\n"
    assert "def add" in files.read_file("calc.py")  # the repo itself, as before


# one per test process: tests run side by side (pytest -n) look for their steps in /proc by
# it, and kill what they find; a shared one saw and killed each other's
MARKER = f"choir-gate-step-left-running-7f3a-{os.getpid()}"
SLOW_TEST = f"""\
import subprocess, sys

def test_slow():
    subprocess.run([sys.executable, "-c", "import time; time.sleep(60)", "{MARKER}"])
"""


def _alive(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_the_executors_timeout_stops_its_gates_steps_and_the_check_is_attested(
        tmp_path: Path, choir_home: Path) -> None:
    """The ``llm`` executor's time ran out while its gate verified: the gate's step ran on
    for its own timeout (600 s), on a snapshot removed under it, and its run was sealed with
    no attestation. Its steps are now killed, and the check is attested on what they did."""
    repo = calc_repo(tmp_path / "repo", canary="c", sandbox="local", test_body=SLOW_TEST)
    item = WorkItem(id="wi", goal="g", repo=str(repo))
    verify = green_verifier(item, "run1-exec1")

    async def bounded() -> None:
        await asyncio.wait_for(verify(ChangeSummary(summary="fixed")), timeout=3)

    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            asyncio.run(bounded())
        assert time.monotonic() - started < 30
        time.sleep(0.2)
        assert not _alive(MARKER), "the gate's step still runs after the executor's timeout"
    finally:
        for pid in _alive(MARKER):
            os.kill(pid, 9)
    store = AttestationStore()
    (att,) = [store.get(i) for i in store.ids()]
    assert att.body.lens == "executor_gate" and att.body.result.value != "PASS"
    result = audit()
    assert result.ok, result.violations


def test_stopping_one_rounds_steps_leaves_another_rounds_running(tmp_path: Path) -> None:
    """``stop_runs`` kills only the steps of the runs it names: a plan runs other items'
    rounds in the same process."""
    import threading

    from choir.sandbox import stop
    from choir.sandbox.base import run_process

    results: dict[str, object] = {}

    def step(run_id: str, marker: str) -> None:
        with stop.running(run_id):
            results[run_id] = run_process(
                [sys.executable, "-c", "import time; time.sleep(20)", marker], env=None,
                cwd=str(tmp_path), timeout_s=60, sink=lambda _chunk: None)

    # roundA1 starts with roundA's id, yet is another round: its step runs on
    threads = [threading.Thread(target=step, args=(f"{name}-unit-0", f"{MARKER}={name}="))
               for name in ("roundA", "roundA1")]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (_alive(f"{MARKER}=roundA=")
                                                   and _alive(f"{MARKER}=roundA1=")):
            time.sleep(0.05)
        assert stop.stop_runs("roundA") <= 1  # 0: seen before it registered (killed then)
        threads[0].join(timeout=10)
        assert not threads[0].is_alive() and results["roundA-unit-0"].exit_code != 0
        assert _alive(f"{MARKER}=roundA1="), "another round's step was killed too"
    finally:
        stop.forget("roundA")
        for pid in _alive(MARKER):
            os.kill(pid, 9)
        for thread in threads:
            thread.join(timeout=10)


def test_a_step_of_a_stopped_round_that_starts_late_is_killed_as_it_starts(
        tmp_path: Path) -> None:
    """Review 15, F1: cancelled after its round began but before its step streamed (the
    vouch, the sandbox's preparation), ``stop_runs`` found nothing to kill, and the step ran
    its whole course. A round stopped stays stopped for steps that start later."""
    from choir.sandbox import stop
    from choir.sandbox.base import run_process

    assert stop.stop_runs("roundZ") == 0  # nothing of it runs yet
    try:
        with stop.running("roundZ-unit-0"):
            started = time.monotonic()
            late = run_process([sys.executable, "-c", "import time; time.sleep(20)",
                                f"{MARKER}=late="], env=None, cwd=str(tmp_path), timeout_s=60,
                               sink=lambda _chunk: None)
        assert time.monotonic() - started < 10 and late.exit_code != 0
    finally:
        stop.forget("roundZ")
        for pid in _alive(f"{MARKER}=late="):
            os.kill(pid, 9)
    with stop.running("roundZ-unit-0"):  # forgotten: the id stops nothing more
        assert run_process(["true"], env=None, cwd=str(tmp_path), timeout_s=60,
                           sink=lambda _chunk: None).exit_code == 0


def test_a_second_cancellation_during_the_gates_cleanup_still_stops_and_attests(
        tmp_path: Path, choir_home: Path) -> None:
    """Review 15, F2: the wait for the round in the cleanup was not shielded, so a second
    cancellation (Ctrl-C, the run's own) left the step running on a removed snapshot and
    its run unattested."""
    import choir.agent.executor as executor

    repo = calc_repo(tmp_path / "repo", canary="c", sandbox="local", test_body=SLOW_TEST)
    item = WorkItem(id="wi", goal="g", repo=str(repo))
    verify = green_verifier(item, "run1-exec1")
    real_round = executor.run_round

    async def twice() -> None:
        entered = asyncio.Event()

        async def round_started(*args: object, **kwargs: object) -> object:
            entered.set()
            return await real_round(*args, **kwargs)  # type: ignore[arg-type]

        executor.run_round = round_started  # type: ignore[assignment]
        task = asyncio.ensure_future(verify(ChangeSummary(summary="fixed")))
        await entered.wait()
        task.cancel()
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    started = time.monotonic()
    try:
        asyncio.run(twice())
        assert time.monotonic() - started < 30
        time.sleep(0.2)
        assert not _alive(MARKER), "the gate's step still runs after two cancellations"
    finally:
        executor.run_round = real_round
        for pid in _alive(MARKER):
            os.kill(pid, 9)
    store = AttestationStore()
    assert [store.get(i).body.lens for i in store.ids()] == ["executor_gate"]
    result = audit()
    assert result.ok, result.violations
