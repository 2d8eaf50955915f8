"""The orchestrator loop through the real CLI: real sandboxes, SQLite checkpoints, AHDB."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests import forked
from tests.workitems import PY, calc_repo

CANARY = "CANARY-7f3a9c-raw-output-must-stay-in-artifacts"


def make_item(tmp_path: Path, *, executor: str, blast: str = "small",
              max_attempts: int = 4, test_body: str | None = None) -> Path:
    calc_repo(tmp_path / "repo", canary=CANARY, test_body=test_body)
    spy(tmp_path).mkdir()
    (tmp_path / "fix.py").write_text(textwrap.dedent(f"""\
        import os, shutil, sys, time
        from pathlib import Path
        fb = os.environ.get("CHOIR_FEEDBACK_FILE")
        if fb:
            attempt = os.environ["CHOIR_ATTEMPT"]
            shutil.copy(fb, Path({str(spy(tmp_path))!r}) / f"feedback-{{attempt}}.json")
            if os.environ.get("SLOW_FIX"):
                Path({str(spy(tmp_path))!r}, "executing").touch()
                time.sleep(300)  # killed long before: a loaded machine is slow to get there
            calc = Path("calc.py")
            calc.write_text(calc.read_text().replace("a - b", "a + b"))
        """))
    item = tmp_path / "item.yaml"
    item.write_text(textwrap.dedent(f"""\
        id: fix-add
        goal: add must add
        repo: ./repo
        max_attempts: {max_attempts}
        blast_radius: {blast}
        executor:
          kind: command
          command: {json.dumps(executor)}
        """))
    return item


def choir(*args: str, env: dict[str, str] | None = None,
          timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=timeout, env=env)


def spy(tmp_path: Path) -> Path:
    """Where the test executor leaves what it saw: inside the repo, the one folder an
    executor may write (it runs sandboxed; its own folder is read-only there)."""
    return tmp_path / "repo" / ".spy"


def fix_cmd(tmp_path: Path) -> str:
    return f"{PY} {tmp_path / 'fix.py'}"


def test_fail_hypothesize_fix_pass_assert_gate(tmp_path: Path) -> None:
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    proc = choir("run", str(item), "--run-id", "r1", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "asserted" and out["attempt"] == 2
    assert choir("gate", "fix-add", "--repo", str(tmp_path / "repo")).returncode == 0
    atoms = json.loads(choir("ahdb", "list", "--json").stdout)
    kinds = sorted((a["kind"], a["status"]) for a in atoms)
    # the fixed tree passes: the hypothesis of the failing round is confirmed
    assert kinds == [("ASSERT", "PROMOTED"), ("ASSERT", "PROMOTED"),
                     ("HYPOTHESIZE", "PROMOTED")]
    hyp = next(a for a in atoms if a["kind"] == "HYPOTHESIZE")
    assert "test_add" in hyp["discriminating_test"]
    # the executor got bounded reports, never raw output
    feedback = json.loads((spy(tmp_path) / "feedback-2.json").read_text())
    assert feedback[0]["result"] == "FAIL" and "tail_log" not in json.dumps(feedback)
    assert choir("audit").returncode == 0


def assert_canary_only_in_artifacts(choir_home: Path, tmp_path: Path) -> None:
    stored = [p for p in (choir_home / "artifacts").rglob("*") if p.is_file()
              and CANARY.encode() in p.read_bytes()]
    assert stored, "the canary must be in the artifact store (raw output is kept)"
    for name in ("checkpoints.sqlite", "ahdb.sqlite"):
        for path in choir_home.glob(name + "*"):
            assert CANARY.encode() not in path.read_bytes(), path
    for path in (choir_home / "attestations").glob("*.json"):
        assert CANARY not in path.read_text()
    feedback = list(spy(tmp_path).glob("feedback-*.json"))
    assert feedback
    for path in feedback:
        assert CANARY not in path.read_text()


def test_canary_stays_in_the_artifact_store(tmp_path: Path, choir_home: Path) -> None:
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    assert choir("run", str(item)).returncode == 0
    assert_canary_only_in_artifacts(choir_home, tmp_path)


@pytest.mark.slow  # a whole run or two: CI's slow stage
def test_canary_stays_out_even_when_the_reporter_model_obeys_the_log(
    tmp_path: Path, choir_home: Path
) -> None:
    """The cheap reporter reads raw windows by design; told by the log to repeat the canary,
    it does, everywhere it can. None of it may reach the loop, the Director or the executor."""
    import re

    from choir.testing import FakeModelServer, text

    def answer(messages: list[dict[str, str]]) -> Any:
        prompt = messages[-1]["content"]
        if "You are the Director" in messages[0]["content"]:
            return text(json.dumps({"verifiers": [], "reason": "the plan fits"}))
        seen = re.findall(r"CANARY-[\w-]+", prompt)
        leak = seen[0] if seen else "nothing to leak"
        return text(json.dumps({"summary": f"The log says: {leak}.",
                                "next_actions": [f"Grep for {leak}", "Fix add."],
                                "confidence": 0.9, "hyperthesis": [leak], "propose": "none"}))

    with FakeModelServer([answer], name="cheap", repeat_last=True) as server:
        item = make_item(tmp_path, executor=fix_cmd(tmp_path))
        config = tmp_path / "repo" / "choir.yaml"
        config.write_text(config.read_text()
                          + f"models: {{reporter: {server.model}, director: {server.model}}}\n")
        env = dict(os.environ, OPENAI_API_BASE=server.api_base, OPENAI_API_KEY="sk-fake")
        proc = choir("run", str(item), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    reporter_prompts = [b for b in server.bodies if "verification reporter" in
                        b["messages"][0]["content"]]
    director_prompts = [b for b in server.bodies if "You are the Director" in
                        b["messages"][0]["content"]]
    assert any(CANARY in json.dumps(b) for b in reporter_prompts)  # the model did see it
    assert director_prompts and CANARY not in json.dumps(director_prompts)
    assert CANARY not in proc.stdout and CANARY not in proc.stderr
    assert_canary_only_in_artifacts(choir_home, tmp_path)


@pytest.mark.slow  # a whole run or two: CI's slow stage
def test_same_failure_switches_mood_then_halts_within_budget(tmp_path: Path) -> None:
    item = make_item(tmp_path, executor="true", max_attempts=6)
    proc = choir("run", str(item), "--json")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["status"] == "halted" and out["attempt"] == 3
    assert "CALM -> CURIOUS" in proc.stderr and "same failure 3 rounds" in out["reason"]
    assert choir("gate", "fix-add").returncode == 1


def test_attempt_budget_halts(tmp_path: Path) -> None:
    item = make_item(tmp_path, executor="true", max_attempts=1)
    out = json.loads(choir("run", str(item), "--json").stdout)
    assert out["status"] == "halted" and "budget" in out["reason"]


@pytest.mark.slow  # a whole run or two: CI's slow stage
def test_large_blast_radius_waits_for_a_human(tmp_path: Path) -> None:
    """The gate opens only once a person approved: the ASSERT was written before the
    question, so ``choir gate`` answered 0 while the run waited (review 17, F1)."""
    item = make_item(tmp_path, executor=fix_cmd(tmp_path), blast="large")
    proc = choir("run", str(item), "--run-id", "big")
    assert proc.returncode == 3 and "choir approve big" in proc.stdout
    gate = ("gate", "fix-add", "--repo", str(tmp_path / "repo"))
    assert choir(*gate).returncode == 1, "the gate opened before a person approved"
    assert choir("approve", "big").returncode == 0
    assert choir(*gate).returncode == 0


@pytest.mark.slow  # a whole run or two: CI's slow stage
def test_a_human_can_reject(tmp_path: Path) -> None:
    """A rejection leaves nothing ASSERTed: the gate stayed open after ``--reject``, and
    ``choir audit`` clean (review 17, F1)."""
    item = make_item(tmp_path, executor=fix_cmd(tmp_path), blast="large")
    assert choir("run", str(item), "--run-id", "big2").returncode == 3
    proc = choir("approve", "big2", "--reject")
    assert proc.returncode == 1 and "REJECTED" in proc.stdout
    assert choir("gate", "fix-add", "--repo", str(tmp_path / "repo")).returncode == 1
    assert choir("audit").returncode == 0


def test_bad_work_item_exits_2_and_runs_nothing(tmp_path: Path) -> None:
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    item.write_text(item.read_text().replace("max_attempts: 4", "max_attempts: -1"))
    proc = choir("run", str(item))
    assert proc.returncode == 2 and f"{item}:" in proc.stderr
    assert not list(spy(tmp_path).glob("feedback-*"))


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_completes_without_double_counting(
    tmp_path: Path, choir_home: Path
) -> None:
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    env = dict(os.environ, SLOW_FIX="1")
    proc = subprocess.Popen([PY, "-m", "choir", "run", str(item), "--run-id", "crashy"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (spy(tmp_path) / "executing").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the orchestrator and the executor die mid-attempt 2
    proc.wait()
    attestations_before = set((choir_home / "attestations").glob("*.json"))
    assert len(attestations_before) == 1
    resumed = choir("run", "--resume", "crashy", "--json")
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["status"] == "asserted" and out["attempt"] == 2  # attempt 2 redone, not 3
    after = set((choir_home / "attestations").glob("*.json"))
    assert attestations_before < after and len(after) == 2
    # resuming a finished run changes nothing
    again = choir("run", "--resume", "crashy", "--json")
    assert json.loads(again.stdout)["attempt"] == 2
    assert set((choir_home / "attestations").glob("*.json")) == after
    assert choir("audit").returncode == 0
    shutil.rmtree(tmp_path / "repo", ignore_errors=True)


def test_an_unknown_sandbox_is_a_configuration_error_and_nothing_runs(tmp_path: Path) -> None:
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    config = tmp_path / "repo" / "choir.yaml"
    config.write_text(config.read_text() + "sandbox: {backend: no-such-sandbox}\n")
    proc = choir("run", str(item), "--json")
    assert proc.returncode == 2 and "no-such-sandbox" in proc.stderr
    assert proc.stdout == "" and not list(spy(tmp_path).glob("feedback-*"))
    assert json.loads(choir("ahdb", "list", "--json").stdout) == []


@pytest.mark.docker
def test_inconclusive_evidence_gets_nested_rounds_costs_no_attempt_and_never_promotes(
    tmp_path: Path,
) -> None:
    """A test tool that is not installed in the sandbox: every run is INCONCLUSIVE (exit 127,
    nothing was checked). (A configured Docker image that is missing is refused up front.)"""
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    config = tmp_path / "repo" / "choir.yaml"
    text = config.read_text()
    command = next(line.split("command:", 1)[1].strip() for line in text.splitlines()
                   if "command:" in line and "pytest" in line)
    config.write_text(text.replace(command, "choir_no_such_test_tool -q"))
    proc = choir("run", str(item), "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 1 and out["status"] == "halted", proc.stderr
    assert out["attempt"] == 1  # nested rounds never ran the executor again
    assert "still inconclusive after 2 nested round(s)" in out["reason"]
    assert "nested round 1" in proc.stderr and "nested round 2" in proc.stderr
    assert "(clean_rerun)" in proc.stderr
    atoms = json.loads(choir("ahdb", "list", "--json").stdout)
    assert [a["kind"] for a in atoms] == ["HYPERTHESIS"] * 3  # one disclosure per round
    assert choir("gate", "fix-add").returncode == 1
    assert choir("audit").returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("point", [
    "execute:done", "green:ran", "attest:minted", "adjudicate:written",
])
def test_kill_9_at_each_failpoint_then_resume_counts_and_mints_exactly_once(
    tmp_path: Path, choir_home: Path, point: str
) -> None:
    """SIGKILL right after a side effect, before its checkpoint: resume must not repeat it."""
    from choir._core.failpoints import ENV, POINTS

    assert point in POINTS
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    crashed = choir("run", str(item), "--run-id", "fp", env=dict(os.environ, **{ENV: point}))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    resumed = choir("run", "--resume", "fp", "--json")
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["status"] == "asserted" and out["attempt"] == 2
    # one verifier per round, two rounds: two runs, two attestations, three atoms
    assert len(list((choir_home / "attestations").glob("*.json"))) == 2
    kinds = sorted(a["kind"] for a in json.loads(choir("ahdb", "list", "--json").stdout))
    assert kinds == ["ASSERT", "ASSERT", "HYPOTHESIZE"]
    runs = sorted(p.name for p in (choir_home / "artifacts" / "runs").iterdir())
    assert runs == ["fp-r0-unit-0", "fp-r1-unit-0"]
    assert choir("audit").returncode == 0


@pytest.mark.slow  # a whole run or two: CI's slow stage
def test_a_taken_run_id_and_a_missing_one_are_usage_errors(tmp_path: Path) -> None:
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    assert choir("run", str(item), "--run-id", "once").returncode == 0
    again = choir("run", str(item), "--run-id", "once")
    assert again.returncode == 2 and "run id once is taken" in again.stderr
    missing = choir("run", "--resume", "never-was")
    assert missing.returncode == 2 and "no run never-was" in missing.stderr


@pytest.mark.slow
def test_a_run_is_driven_by_one_process_at_a_time(tmp_path: Path) -> None:
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    env = dict(os.environ, SLOW_FIX="1")
    first = subprocess.Popen([PY, "-m", "choir", "run", str(item), "--run-id", "busy"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (spy(tmp_path) / "executing").exists():
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
        second = choir("run", "--resume", "busy")
        assert second.returncode == 2
        assert "run busy is being driven by another process" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert choir("run", "--resume", "busy").returncode == 0  # the lock died with its owner


def test_a_crashed_green_thread_is_inconclusive_evidence_not_a_crashed_run(
    tmp_path: Path,
) -> None:
    import asyncio

    from choir.config import load_repo_config, load_work_item
    from choir.config.policy import load_policy
    from choir.evidence.target import resolve_target
    from choir.graph.orchestrator import green_thread
    from choir.graph.state import GreenIn
    from choir.models import PlannedVerifier, Result

    item = load_work_item(make_item(tmp_path, executor=fix_cmd(tmp_path)))
    config = load_repo_config(Path(item.repo))
    # a verifier the allowlist does not hold, on the real tree: the thread crashes
    state = GreenIn(work_item=item, config=config, policy=load_policy(config),
                    planned=PlannedVerifier(name="gone", replica=1),
                    target=resolve_target(Path(item.repo), item.id), run_id="c-r0-gone-1",
                    mood="CALM")
    run = asyncio.run(green_thread(state))["runs"][0]
    assert run.report.result is Result.INCONCLUSIVE and run.report.verifier_type == "crashed"
    assert run.report_hash == "" and run.replica == 1  # nothing to attest, nothing promotes
    assert "KeyError" in run.report.summary and run.report.confidence == 0.0


def test_an_executor_that_rewrites_the_allowlist_changes_nothing_in_the_run(
    tmp_path: Path, choir_home: Path
) -> None:
    """choir.yaml is pinned when the run starts: the executor cannot weaken what verifies it."""
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    cheat = tmp_path / "cheat.py"
    cheat.write_text(textwrap.dedent("""\
        import pathlib
        pathlib.Path("choir.yaml").write_text(
            "verifiers:\\n  unit:\\n    kind: unit_tests\\n"
            "    steps: [{name: pytest, command: 'true'}]\\n"
            "sandbox: {backend: local}\\n")
        """))
    # sandboxed, the write fails (choir.yaml is pinned spec, read-only to the executor) and
    # the fix runs after it; unsandboxed it lands, and a tree whose spec changed is refused
    item.write_text(item.read_text().replace(fix_cmd(tmp_path),
                                             f"{PY} {cheat}; {fix_cmd(tmp_path)}"))
    proc = choir("run", str(item), "--json")
    if not shutil.which("bwrap"):
        assert proc.returncode == 1 and "spec change refused" in proc.stdout, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["attempt"] == 2  # the rewritten `true` did not pass attempt 1
    bodies = [json.loads(p.read_text())["body"]
              for p in (choir_home / "attestations").glob("*.json")]
    assert {b["result"] for b in bodies} == {"FAIL", "PASS"}
    assert all("pytest -q" in b["commands"][0] for b in bodies)
    assert all(b["environment"]["sandbox"] != "local" or not shutil.which("bwrap")
               for b in bodies)


@pytest.mark.slow  # a whole run or two: CI's slow stage
def test_an_invalid_run_id_is_a_usage_error(tmp_path: Path) -> None:
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    for bad in ("../escape", "has space", "x" * 101):
        proc = choir("run", str(item), "--run-id", bad)
        assert proc.returncode == 2 and "invalid run id" in proc.stderr
    assert not list(spy(tmp_path).glob("feedback-*"))


@pytest.mark.slow  # a whole run or two: CI's slow stage
def test_an_executor_sandbox_that_fails_to_start_charges_no_attempt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, choir_home: Path) -> None:
    """Review 17, F2: the executor's sandbox failing to start (bwrap could not prepare the
    run: a full disk) was charged as one of its attempts; with ``max_attempts: 1`` the run
    halted "budget spent" though the executor never ran. The run now stops before the
    attempt is recorded, and ``resume`` tries the same attempt again."""
    import asyncio

    from choir.exceptions import SandboxError
    from choir.graph.runner import resume, run_work_item

    item = make_item(tmp_path, executor="sed -i s/a\\ -\\ b/a\\ +\\ b/ calc.py",
                     max_attempts=1)
    starts = _executor_fails_once(monkeypatch)
    with pytest.raises(SandboxError, match="no attempt was charged"):
        asyncio.run(run_work_item(item, run_id="infra"))
    out = asyncio.run(resume("infra"))
    assert out.status == "asserted" and out.attempt == 1, (out.status, out.reason)
    assert starts["executor"] == 2


def _executor_fails_once(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The executor's first bwrap start fails as bwrap does on a full disk; how many
    executor starts there were."""
    from choir.sandbox.base import ExecResult
    from choir.sandbox.bwrap import BwrapSandbox

    if shutil.which("bwrap") is None:
        pytest.skip("the executor runs in bubblewrap")
    real = BwrapSandbox.exec
    starts = {"executor": 0}

    def failing_once(self: BwrapSandbox, command: str, **kw: Any) -> ExecResult:
        if kw.get("repo_writable"):  # the executor's sandbox (a verifier's repo is read-only)
            starts["executor"] += 1
            if starts["executor"] == 1:
                return ExecResult(-1, 0, infra_error="bwrap could not prepare the run: "
                                  "[Errno 28] No space left on device")
        return real(self, command, **kw)

    monkeypatch.setattr(BwrapSandbox, "exec", failing_once)
    return starts


@pytest.mark.slow  # a whole run: CI's slow stage
def test_the_verified_work_item_subgraph_resumes_a_run_the_infrastructure_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, choir_home: Path) -> None:
    """A plan item (or a user's graph node) whose executor sandbox failed to start: the
    subgraph resumes the same run, the same attempt, instead of failing the item."""
    import asyncio

    from choir.team import subgraph

    monkeypatch.setattr(subgraph, "INFRA_WAIT_S", 0.01)
    item = make_item(tmp_path, executor="sed -i s/a\\ -\\ b/a\\ +\\ b/ calc.py",
                     max_attempts=1)
    starts = _executor_fails_once(monkeypatch)
    done = asyncio.run(subgraph.work_item_graph().ainvoke(
        {"work_item": str(item), "run_id": "infra-plan"}))
    (outcome,) = done["outcomes"]
    assert outcome["status"] == "asserted" and outcome["attempt"] == 1, outcome
    assert starts["executor"] == 2
