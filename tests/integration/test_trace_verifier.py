"""The ``trace`` verifier kind: a run's own trace, verified and attested like any verifier,
so a policy that lists it (PARANOID does, by kind) cannot ASSERT on an unverified trace."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from choir.attest import AttestationStore
from choir.config import load_repo_config
from choir.config.policy import load_policy
from choir.models import Mood
from tests import forked
from tests.integration.test_orchestrator import fix_cmd, make_item
from tests.workitems import PY, calc_repo

# whole runs that record, forge and verify traces:
# CI's slow stage runs it, so that the README's command stays under five minutes
pytestmark = pytest.mark.slow

TRACE_VERIFIER = "trace:\n  kind: trace\n  steps:\n    - name: verify\n" \
                 "      command: choir trace verify\n"


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "CHOIR_HOME": str(home), "CHOIR_ARTIFACT_DIR": str(home / "artifacts")}


def _with_trace_verifier(tmp_path: Path) -> Path:
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    config = tmp_path / "repo" / "choir.yaml"
    text = config.read_text().replace("verifiers:\n", "verifiers:\n" + "".join(
        "  " + line + "\n" for line in TRACE_VERIFIER.splitlines()), 1)
    config.write_text(text + "moods:\n  CALM: {verifiers: [unit, trace]}\n")
    return item


def _run(item: Path, home: Path, run_id: str) -> tuple[int, dict[str, Any]]:
    proc = forked.run([PY, "-m", "choir", "run", str(item), "--run-id", run_id, "--json"],
                      capture_output=True, text=True, timeout=300, env=_env(home))
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_paranoid_plans_a_trace_verifier_calm_does_not(tmp_path: Path) -> None:
    repo = calc_repo(tmp_path / "repo", canary="x", verifiers=TRACE_VERIFIER)
    policy = load_policy(load_repo_config(repo))
    assert "trace" in policy.moods[Mood.PARANOID].verifiers
    assert "trace" not in policy.moods[Mood.CALM].verifiers


def test_a_verified_trace_is_attested_and_backs_the_assert(tmp_path: Path,
                                                           choir_home: Path) -> None:
    item = _with_trace_verifier(tmp_path)
    code, out = _run(item, choir_home, "tv1")
    assert code == 0 and out["status"] == "asserted", out
    atts = AttestationStore(choir_home / "attestations")
    traced = [a for a in (atts.get(i) for i in atts.ids()) if a.body.verifier_kind == "trace"]
    assert len(traced) == 2 and all(a.body.result.value == "PASS" for a in traced)
    assert {a.body.environment.sandbox for a in traced} == {"in-process"}
    audit = forked.run([PY, "-m", "choir", "audit"], capture_output=True, text=True,
                       timeout=120, env=_env(choir_home))
    assert audit.returncode == 0, audit.stdout


def test_a_forged_trace_record_stops_the_assert(tmp_path: Path, choir_home: Path) -> None:
    """A record planted before the run (a result nobody called): the trace verifier FAILs
    every round, so the work item is never ASSERTed although the code is fixed."""
    item = _with_trace_verifier(tmp_path)
    traces = choir_home / "traces"
    traces.mkdir()
    (traces / "tv2.jsonl").write_text(json.dumps(
        {"seq": 1, "kind": "tool_result", "ts": "2026-01-01T00:00:00+00:00", "name": "unit",
         "call_id": "planted", "data": {"result": "PASS"}}) + "\n")
    code, out = _run(item, choir_home, "tv2")
    assert code == 1 and out["status"] != "asserted"
    atoms = forked.run([PY, "-m", "choir", "ahdb", "list", "--json"], capture_output=True,
                       text=True, timeout=60, env=_env(choir_home))
    assert not [a for a in json.loads(atoms.stdout) if a["kind"] == "ASSERT"]
    atts = AttestationStore(choir_home / "attestations")
    bodies = [atts.get(i).body for i in atts.ids()]
    assert {b.result.value for b in bodies if b.verifier_kind == "trace"} == {"FAIL"}
    assert "PASS" in {b.result.value for b in bodies if b.verifier == "unit"}  # code was fixed


def test_choir_verify_drops_a_trace_verifier_it_has_no_run_for(tmp_path: Path) -> None:
    """Outside ``choir run`` there is no run trace: PARANOID's trace verifier is dropped and
    named, not run as a shell step (which made every PARANOID ``choir verify`` INCONCLUSIVE)."""
    from choir.app.verify import verify_tree

    repo = calc_repo(tmp_path / "repo", canary="x", verifiers=TRACE_VERIFIER,
                     extra="moods:\n  PARANOID: {verifiers: [unit, trace]}\n")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    events: list[dict[str, Any]] = []
    outcome = verify_tree(repo, mood=Mood.PARANOID, sandbox_name="bwrap",
                          on_event=lambda kind, data: events.append(data))
    assert outcome.contract["status"] == "PASS", outcome.contract["tail_log"][-800:]
    planned = next(e for e in events if e.get("kind") == "plan")
    assert planned["verifiers"] == ["unit#0", "unit#1"] and planned["dropped"] == ["trace"]
    assert "choir run only" in planned["reason"]


def test_paranoid_demands_a_verified_trace_even_when_the_repo_declares_none(
        tmp_path: Path, choir_home: Path) -> None:
    """PARANOID requires a verified trace (``require_trace``): a run of a repo whose
    allowlist has no trace verifier gets Choir's own, and its ASSERT rests on it."""
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    assert "kind: trace" not in (tmp_path / "repo" / "choir.yaml").read_text()
    proc = forked.run([PY, "-m", "choir", "run", str(item), "--run-id", "tv3", "--json",
                       "--mood", "PARANOID"], capture_output=True, text=True, timeout=300,
                      env=_env(choir_home))
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["status"] == "asserted", proc.stdout[-2000:]
    atts = AttestationStore(choir_home / "attestations")
    bodies = [atts.get(i).body for i in atts.ids()]
    traced = [b for b in bodies if b.verifier_kind == "trace"]
    assert traced and {b.result.value for b in traced} == {"PASS"}
    assert {b.verifier for b in traced} == {"trace"}
    # CALM plans no trace verifier: the default kinds and the fallback both leave it out
    repo = tmp_path / "repo"
    from choir.config.policy import with_run_checks

    policy = load_policy(with_run_checks(load_repo_config(repo)))
    assert "trace" in policy.moods[Mood.PARANOID].verifiers
    assert "trace" not in policy.moods[Mood.CALM].verifiers


def test_the_trace_verifier_reads_what_the_run_has_sealed_while_a_node_writes(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Green threads end one by one: the recorder writes a finished thread's events, then (a
    broker signature later) their seal, while the round's trace verifier may be reading the
    run's trace in another thread. CI caught a PARANOID rerun of the trace verifier reading
    "events 5..6 are not sealed" and FAILing a sound run. It verifies the part the run has
    sealed; a seal that names more events than the record holds still fails it."""
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import PlannedVerifier, Result, Target
    from choir.trace.record import TraceRecorder, read_trace, record_path
    from choir.trace.step import run_trace_step

    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(choir_home / "artifacts"))
    code, out = _run(_with_trace_verifier(tmp_path), choir_home, "tv4")
    assert code == 0 and out["status"] == "asserted", out
    # a node's events written, its seal not yet: the window between _commit's two writes
    recorder = TraceRecorder("tv4", choir_home)
    recorder.emit("tool_call", name="unit", call_id="tv4-r9-unit-0", data={"verifier": "unit"})
    recorder._append(b"".join(recorder._batch))
    store, target = ArtifactStore(), Target(tree_hash="0" * 64)
    run = run_trace_step(PlannedVerifier(name="trace"), "tv4-r9-trace-0", target, store)
    assert run.report.result is Result.PASS, run.report.summary
    # the record cut short of its last seal: not what the run sealed, so not a pass
    path = record_path("tv4", choir_home)
    lines = path.read_bytes().splitlines(keepends=True)
    events, seals = read_trace(path)
    last = b'"seq":%d,' % seals[-1].seq  # the last sealed event goes, its seal stays
    cut = [line for line in lines if last not in line or b'"seal":' in line]
    path.write_bytes(b"".join(cut))
    assert len(read_trace(path)[0]) < len(events)
    run = run_trace_step(PlannedVerifier(name="trace"), "tv4-r9-trace-1", target, store)
    assert run.report.result is Result.FAIL and "seal_integrity" in run.report.summary, \
        run.report.summary
