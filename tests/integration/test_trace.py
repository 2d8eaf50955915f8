"""Traces of real runs: a real ``choir run`` (sandboxed executor, pytest verifier, SQLite
AHDB) records its trace; the export verifies, and one edit per hard-failure trigger (seed 004)
fails with exactly the check that names it."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.trace import CHECKS, RecordSources, export_run, verify_trace
from choir.trace.grounding import GROUNDING_CHECKS
from choir.trace.verify import TraceVerification
from tests import forked
from tests.integration.test_orchestrator import fix_cmd, make_item
from tests.workitems import PY

# real runs whose traces are recorded, forged and verified:
# CI's slow stage runs it, so that the README's command stays under five minutes
pytestmark = pytest.mark.slow

Edit = Callable[[dict[str, Any], Path], None]


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "CHOIR_HOME": str(home), "CHOIR_ARTIFACT_DIR": str(home / "artifacts")}


def real_run(base: Path) -> Path:
    """One real run ``t1`` (FAIL, HYPOTHESIZE, fix, PASS, ASSERT) under ``base``: its home."""
    home = base / "home"
    home.mkdir()
    item = make_item(base, executor=fix_cmd(base))
    proc = forked.run([PY, "-m", "choir", "run", str(item), "--run-id", "t1", "--json"],
                      capture_output=True, text=True, timeout=300, env=_env(home))
    assert proc.returncode == 0, proc.stderr
    return home


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real run shared by the tests: its home."""
    return real_run(tmp_path_factory.mktemp("trace-run"))


@pytest.fixture
def home(made: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the run's home: tests may tamper with it."""
    copy_ = tmp_path / "home-copy"
    shutil.copytree(made, copy_, symlinks=True)
    for key, value in _env(copy_).items():
        if key.startswith("CHOIR_"):
            monkeypatch.setenv(key, value)
    return copy_


def _trace(home: Path) -> dict[str, Any]:
    raw: dict[str, Any] = export_run("t1", home=home, store=ArtifactStore(home / "artifacts")
                                     ).model_dump(mode="json")
    return raw


def _verify(raw: Any, home: Path) -> TraceVerification:
    store = ArtifactStore(home / "artifacts")
    return verify_trace(json.loads(json.dumps(raw)), store,
                        sources=RecordSources.of_home(home, store))


def _failed(result: TraceVerification) -> set[str]:
    return {f.check for f in result.failures}


def test_a_real_run_records_a_trace_that_verifies(home: Path) -> None:
    raw = _trace(home)
    assert next(iter(raw)) == "schema_version"
    result = _verify(raw, home)
    assert result.ok, result.failures
    assert [c.name for c in result.checks] == list(CHECKS)
    kinds = [e["kind"] for e in raw["events"]]
    assert kinds[0] == "run_started" and kinds[-1] == "run_ended"
    assert kinds.count("tool_call") == kinds.count("tool_result") >= 4  # 2 executions, 2 unit
    claim_kinds = {c["kind"] for c in raw["claims"]}
    assert {"report_summary", "failure_signature", "HYPOTHESIZE", "ASSERT"} <= claim_kinds
    assert raw["plan"]["required"] == [] and len(raw["plan"]["planned"]) == 2
    assert raw["outcome"]["status"] == "asserted"
    assert raw["outcome"]["insufficient_evidence"] is None
    assert result.summary_metrics["evidence_verified"] == len(raw["evidence"]) > 0


def _first(raw: dict[str, Any], kind: str, name: str | None = None) -> dict[str, Any]:
    return next(e for e in raw["events"] if e["kind"] == kind
                and (name is None or e["name"] == name))


def _cited(raw: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in raw["claims"] if c["kind"] == "failure_signature")


def _uncited_evidence(raw: dict[str, Any]) -> dict[str, Any]:
    cited = {c["artifact"] for claim in raw["claims"] for c in claim["citations"]}
    return next(e for e in raw["evidence"] if e["hash"] not in cited)


def _object(home: Path, digest: str) -> Path:
    return home / "artifacts" / "objects" / digest[:2] / digest[2:]


def _tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))


def _drop_field(raw: dict[str, Any], _: Path) -> None:
    del raw["events"][1]["ts"]


def _bad_kind(raw: dict[str, Any], _: Path) -> None:
    raw["events"][2]["kind"] = "tool_cal"


def _trace_version(raw: dict[str, Any], _: Path) -> None:
    raw["schema_version"] = 2


def _plan_version(raw: dict[str, Any], _: Path) -> None:
    raw["plan"]["schema_version"] = 99


def _time_goes_back(raw: dict[str, Any], _: Path) -> None:
    raw["events"][3]["ts"] = "2001-01-01T00:00:00Z"


def _seq_gap(raw: dict[str, Any], _: Path) -> None:
    raw["events"][-1]["seq"] += 5


def _phantom_result(raw: dict[str, Any], _: Path) -> None:
    _first(raw, "tool_result", "unit")["call_id"] = "never-called"


def _call_without_result(raw: dict[str, Any], _: Path) -> None:
    result = _first(raw, "tool_result", "executor")
    result["kind"] = "decision"
    del result["call_id"]


def _required_absent(raw: dict[str, Any], _: Path) -> None:
    raw["plan"]["required"] = ["security"]


def _planned_step_absent(raw: dict[str, Any], _: Path) -> None:
    raw["plan"]["planned"].append({"plan": 1, "name": "lint", "replica": 0,
                                   "lens": "default"})


def _truncated(raw: dict[str, Any], _: Path) -> None:
    raw["events"][-1]["kind"] = "decision"


def _marker_missing(raw: dict[str, Any], _: Path) -> None:
    claim = _cited(raw)
    claim["text"] = claim["text"].replace("[@1]", "")


def _marker_malformed(raw: dict[str, Any], _: Path) -> None:
    claim = _cited(raw)
    claim["text"] = claim["text"].replace("[@1]", "[@one]")


def _no_citation(raw: dict[str, Any], _: Path) -> None:
    claim = next(c for c in raw["claims"] if c["kind"] == "ASSERT")
    claim["citations"] = []
    claim["text"] = claim["text"].split(" [@")[0]


def _span_past_end(raw: dict[str, Any], _: Path) -> None:
    _cited(raw)["citations"][0]["line_end"] = 10**6


def _span_backwards(raw: dict[str, Any], _: Path) -> None:
    cite = _cited(raw)["citations"][0]
    cite["line_start"], cite["line_end"] = cite["line_end"] + 1, cite["line_end"]


def _span_hash(raw: dict[str, Any], _: Path) -> None:
    cite = _cited(raw)["citations"][0]
    cite["span_hash"] = ("0" if cite["span_hash"][0] != "0" else "1") + cite["span_hash"][1:]


def _span_moved(raw: dict[str, Any], _: Path) -> None:
    cite = _cited(raw)["citations"][0]
    cite["line_start"] = cite["line_end"] = 1 if cite["line_start"] != 1 else 2


def _evidence_missing(raw: dict[str, Any], home: Path) -> None:
    _object(home, _uncited_evidence(raw)["hash"]).unlink()


def _evidence_altered(raw: dict[str, Any], home: Path) -> None:
    _tamper(_object(home, _uncited_evidence(raw)["hash"]))


def _evidence_renamed(raw: dict[str, Any], _: Path) -> None:
    _uncited_evidence(raw)["hash"] = "ab" * 32


def _insufficient_unmarked(raw: dict[str, Any], _: Path) -> None:
    last = raw["events"][-1]
    raw["events"].insert(-1, {**last, "kind": "insufficient_evidence",
                              "data": {"reason": "no evidence"}})
    raw["events"][-1]["seq"] += 1
    raw["outcome"]["insufficient_evidence"] = {"reason": "no evidence"}


def _insufficient_undeclared(raw: dict[str, Any], _: Path) -> None:
    raw["outcome"]["insufficient_evidence"] = {"reason": "no evidence"}
    for claim in raw["claims"]:
        claim["insufficient"] = True


TRIGGERS: list[tuple[str, Edit]] = [
    ("schema", _drop_field), ("schema", _bad_kind),
    ("version", _trace_version), ("version", _plan_version),
    ("ordering", _time_goes_back), ("ordering", _seq_gap),
    ("tool_linkage", _phantom_result), ("tool_linkage", _call_without_result),
    ("required_steps", _required_absent), ("required_steps", _planned_step_absent),
    ("required_steps", _truncated),
    ("citation_marker", _marker_missing), ("citation_marker", _marker_malformed),
    ("citation_marker", _no_citation),
    ("citation_span", _span_past_end), ("citation_span", _span_backwards),
    ("citation_hash", _span_hash), ("citation_hash", _span_moved),
    ("evidence_integrity", _evidence_missing), ("evidence_integrity", _evidence_altered),
    ("evidence_integrity", _evidence_renamed),
    ("insufficient_evidence", _insufficient_unmarked),
    ("insufficient_evidence", _insufficient_undeclared),
]


@pytest.mark.parametrize(("check", "edit"), TRIGGERS, ids=[e.__name__ for _, e in TRIGGERS])
def test_each_hard_failure_fails_exactly_its_check(home: Path, check: str, edit: Edit) -> None:
    original = _trace(home)
    assert _verify(original, home).ok
    edited = copy.deepcopy(original)
    edit(edited, home)
    result = _verify(edited, home)
    assert not result.ok
    # an edit of sealed or derived content also fails those checks; of the structural ones,
    # exactly the check the edit triggers fails
    assert _failed(result) - set(GROUNDING_CHECKS) == {check}, result.failures
    assert not {c.name: c.passed for c in result.checks}[check]


def test_insufficient_evidence_verifies_when_every_claim_is_marked(home: Path) -> None:
    raw = _trace(home)
    _insufficient_unmarked(raw, home)
    for claim in raw["claims"]:
        claim["insufficient"] = True
    # the rule itself (the edit is not what the run sealed: the structural checks only)
    assert verify_trace(json.loads(json.dumps(raw)), ArtifactStore(home / "artifacts")).ok


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", "trace", *args], capture_output=True, text=True,
                      timeout=120, env=_env(home))


def test_cli_export_and_verify_exit_codes(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "t1.trace.json"
    assert _cli(home, "export", "t1", "-o", str(out)).returncode == 0
    proc = _cli(home, "verify", str(out), "--json")
    assert proc.returncode == 0, proc.stdout
    report = json.loads(proc.stdout)
    assert set(report) == {"ok", "checks", "failures", "summary_metrics"}
    assert report["ok"] is True and report["failures"] == []
    assert [c["name"] for c in report["checks"]] == list(CHECKS)
    raw = json.loads(out.read_text())
    _span_hash(raw, home)
    out.write_text(json.dumps(raw))
    proc = _cli(home, "verify", str(out), "--json")
    assert proc.returncode == 1
    failures = json.loads(proc.stdout)["failures"]
    # the citation no longer hashes, and is not the one the stored report derives
    assert [(f["check"], f["severity"]) for f in failures] == [("citation_hash", "error"),
                                                               ("derived", "error")]
    assert set(failures[0]) == {"check", "severity", "where", "detail"}


def test_cli_usage_errors_exit_2_naming_the_file(home: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    proc = _cli(home, "verify", str(missing))
    assert proc.returncode == 2 and str(missing) in proc.stderr and "export" in proc.stderr
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    proc = _cli(home, "verify", str(garbage), "--json")
    assert proc.returncode == 2 and str(garbage) in proc.stderr and proc.stdout == ""
    proc = _cli(home, "export", "no-such-run")
    assert proc.returncode == 2 and "no-such-run" in proc.stderr


def _audit(home: Path) -> tuple[int, list[dict[str, Any]]]:
    proc = forked.run([PY, "-m", "choir", "audit", "--json"], capture_output=True,
                      text=True, timeout=120, env=_env(home))
    return proc.returncode, json.loads(proc.stdout)["violations"]


def _edit_record(home: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    path = home / "traces" / "t1.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines if keep(x)))


def test_audit_verifies_every_runs_trace(home: Path) -> None:
    code, violations = _audit(home)
    assert code == 0 and violations == []
    _edit_record(home, lambda r: not (r["kind"] == "tool_result" and r["name"] == "unit"))
    code, violations = _audit(home)
    assert code == 1
    kinds = {v["kind"] for v in violations}
    assert "trace_tool_linkage" in kinds and all(k.startswith("trace_") for k in kinds)


def test_audit_names_a_truncated_trace(home: Path) -> None:
    _edit_record(home, lambda r: r["kind"] != "run_ended")  # its seal is left behind
    code, violations = _audit(home)
    assert code == 1 and [v["kind"] for v in violations] == ["trace_required_steps",
                                                             "trace_seal_integrity"]


def test_a_run_without_enough_evidence_says_so(tmp_path: Path) -> None:
    """A verifier that cannot run (command not found): INCONCLUSIVE, nested reruns, halt. The
    run emits an explicit insufficient-evidence output and every claim is marked so."""
    home = tmp_path / "home"
    home.mkdir()
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(
        "verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n"
        "      - name: check\n        command: no-such-tool-7f3a --run\n")
    item = tmp_path / "item.yaml"
    item.write_text("id: probe\ngoal: the tool must pass\nrepo: ./repo\nmax_attempts: 1\n"
                    "executor:\n  kind: command\n  command: 'true'\n")
    proc = forked.run([PY, "-m", "choir", "run", str(item), "--run-id", "t2", "--json"],
                      capture_output=True, text=True, timeout=300, env=_env(home))
    assert proc.returncode == 1, proc.stderr
    assert any(e.startswith("insufficient evidence: ") for e in json.loads(proc.stdout)["events"])
    store = ArtifactStore(home / "artifacts")
    raw = export_run("t2", home=home, store=store).model_dump(mode="json")
    assert raw["outcome"]["insufficient_evidence"]["reason"]
    assert raw["claims"] and all(c["insufficient"] for c in raw["claims"])
    assert verify_trace(json.loads(json.dumps(raw)), store).ok
    raw["claims"][0]["insufficient"] = False
    assert _failed(verify_trace(raw, store)) == {"insufficient_evidence"}


def test_audit_names_a_deleted_trace(home: Path) -> None:
    (home / "traces" / "t1.jsonl").unlink()
    code, violations = _audit(home)
    assert code == 1 and [(v["kind"], v["object"]) for v in violations] == [
        ("trace_missing", "trace t1")]


def test_a_run_killed_and_resumed_leaves_a_trace_that_verifies(tmp_path: Path,
                                                               choir_home: Path) -> None:
    from choir._core.failpoints import ENV

    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    env = _env(choir_home)
    crashed = forked.run([PY, "-m", "choir", "run", str(item), "--run-id", "kr"],
                         capture_output=True, text=True, timeout=300,
                         env={**env, ENV: "attest:minted"})
    assert crashed.returncode < 0, crashed.stderr
    resumed = forked.run([PY, "-m", "choir", "run", "--resume", "kr", "--json"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr
    store = ArtifactStore(choir_home / "artifacts")
    raw = export_run("kr", home=choir_home, store=store).model_dump(mode="json")
    kinds = [e["kind"] for e in raw["events"]]
    assert kinds.count("run_resumed") == 1 and kinds[-1] == "run_ended"
    assert kinds.count("attestation") == 2  # minted once each, though the node ran again
    assert verify_trace(json.loads(json.dumps(raw)), store).ok


def test_audit_names_a_verifier_call_cut_from_a_trace(home: Path) -> None:
    """Cut round 2's verifier (its plan entry, call, result and attestation) from the record:
    the trace alone stays well-formed, but the minted attestation it no longer records is
    named."""
    path = home / "traces" / "t1.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()]
    call = [r for r in records if r["kind"] == "tool_call" and r["name"] == "unit"][-1]
    kept = [r for r in records if r.get("call_id") != call["call_id"]
            and r.get("data", {}).get("call") != call["call_id"]
            and not (r["kind"] == "plan" and r["data"]["plan"] == call["data"]["plan"])]
    for n, record in enumerate(r for r in kept if r["kind"] != "seal"):
        record["seq"] = n + 1
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    code, violations = _audit(home)
    assert code == 1
    assert [v["kind"] for v in violations] == ["trace_unrecorded_attestation",
                                               "trace_seal_integrity", "trace_seal_coverage"]
    assert call["call_id"] in violations[0]["object"]


@contextlib.contextmanager
def _lock_held(home: Path) -> Iterator[None]:
    """Run ``t1``'s lock held by another process for the block's length."""
    holder = subprocess.Popen(
        [PY, "-c", "import fcntl, os, sys, time\n"
                   "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
                   "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(300)",
         str(home / "locks" / "t1.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.communicate()


def _forge_a_sealed_reason(home: Path) -> None:
    path = home / "traces" / "t1.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    first = next(x for x in lines if x.get("kind") == "decision")
    first["data"]["reason"] = "FORGED reason"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.mark.parametrize("ended", [True, False])
def test_a_held_lock_hides_no_rewritten_record_from_the_audit(home: Path, ended: bool) -> None:
    """Review 17a: the audit skipped a run whose lock someone held (a run being driven), so
    any process left holding it (not Choir's) hid a rewritten sealed event: clean, exit 0.
    A record that ended is checked whole whoever holds the lock; one still under way has its
    sealed part checked, as the trace verifier checks it."""
    _forge_a_sealed_reason(home)
    if not ended:
        _edit_record(home, lambda r: r["kind"] not in ("run_ended", "seal") or
                     r.get("seq", 0) < 3)  # an unfinished record: its last seals not yet there
    with _lock_held(home):  # by a process that is not Choir's
        code, violations = _audit(home)
    assert code == 1 and "trace_seal_integrity" in {v["kind"] for v in violations}, violations


def test_a_fifo_for_a_runs_lock_is_named_not_waited_on(home: Path) -> None:
    """Review 17a: the audit opened a run's lock plainly: a FIFO planted there (or a link to
    one) hung it in ``open``."""
    lock = home / "locks" / "t1.lock"
    lock.unlink(missing_ok=True)
    os.mkfifo(lock)
    code, violations = _audit(home)  # its timeout: 120 s
    assert code == 1 and [v["kind"] for v in violations] == ["trace_unreadable"], violations
    assert "not a regular file" in violations[0]["found"]


def test_a_finished_record_cut_back_to_a_seal_is_named_under_a_held_lock(home: Path) -> None:
    """Review 17e: cut an ended record back to an earlier seal (its last attestations, its
    decision and ``run_ended`` gone) and hold its lock: the record no longer looks ended, so
    the audit checked its sealed part as a live run's and named no unrecorded attestation.
    A live run records an attestation as its node returns; one minted longer ago than the
    grace (``CHOIR_AUDIT_LIVE_GRACE_S``, 600 s) and not recorded is named."""
    path = home / "traces" / "t1.jsonl"
    lines = path.read_text().splitlines()
    kinds = [json.loads(x).get("kind") for x in lines]
    cut = max(i for i, k in enumerate(kinds) if k == "seal" and i < kinds.index("run_ended") - 3)
    path.write_text("".join(x + "\n" for x in lines[:cut + 1]))
    with _lock_held(home):
        proc = forked.run([PY, "-m", "choir", "audit", "--json"], capture_output=True,
                          text=True, timeout=120,
                          env={**_env(home), "CHOIR_AUDIT_LIVE_GRACE_S": "0"})  # later
    kinds_found = {v["kind"] for v in json.loads(proc.stdout)["violations"]}
    assert proc.returncode == 1 and "trace_unrecorded_attestation" in kinds_found, kinds_found
