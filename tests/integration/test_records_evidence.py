"""Records are evidence: a real run's stored trace and a real ``choir verify`` session's
manifest are sealed with this home's key, so ``choir audit`` names any edit, deletion, reorder
or truncation; an exported trace is checked against the attestations and AHDB atoms it cites.

Each attack edits what an attacker with write access to ``CHOIR_HOME`` (but not the key) can
edit, and expects a named violation (exit 1), never a pass and never a crash.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import forked
from tests.integration.test_orchestrator import fix_cmd, make_item
from tests.integration.test_trace import _env, real_run
from tests.integration.test_verify_cli import CALC_OK, make_repo, sandbox_name
from tests.workitems import PY

# real homes whose records are forged, cut and audited:
# CI's slow stage runs it, so that the README's command stays under five minutes
pytestmark = pytest.mark.slow

Records = list[dict[str, Any]]


def _choir(home: Path, *args: str, timeout: int = 300,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=timeout, env={**_env(home), **(env or {})})


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run (FAIL, HYPOTHESIZE, fix, PASS, ASSERT) and one real ``choir verify``."""
    base = tmp_path_factory.mktemp("records")
    home = real_run(base)
    repo = make_repo(base / "calc", CALC_OK)
    proc = _choir(home, "verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name())
    assert proc.returncode == 0, proc.stderr
    return home


@pytest.fixture
def home(made: Path, tmp_path: Path) -> Path:
    """A private copy of the shared home: each test tampers with its own."""
    copy = tmp_path / "home"
    shutil.copytree(made, copy, symlinks=True)
    return copy


def _audit(home: Path) -> tuple[int, list[dict[str, Any]]]:
    proc = _choir(home, "audit", "--json", timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)["violations"]


def _kinds(violations: list[dict[str, Any]]) -> set[str]:
    return {v["kind"] for v in violations}


def _trace_file(home: Path) -> Path:
    return home / "traces" / "t1.jsonl"


def _lines(home: Path) -> Records:
    return [json.loads(x) for x in _trace_file(home).read_text().splitlines()]


def _write(home: Path, records: Records) -> None:
    _trace_file(home).write_text("".join(json.dumps(r, sort_keys=True, separators=(",", ":"))
                                         + "\n" for r in records))


def _events(records: Records) -> Records:
    return [r for r in records if r.get("kind") != "seal"]


def _renumber(records: Records) -> Records:
    n = 0
    for r in records:
        if r.get("kind") != "seal":
            n += 1
            r["seq"] = n
    return records


def _earlier_start(records: Records) -> Records:
    first = _events(records)[0]  # a year earlier: the order of events still holds
    first["ts"] = str(int(first["ts"][:4]) - 1) + first["ts"][4:]
    return records


def _decision_reason(records: Records) -> Records:
    decision = next(r for r in records if r.get("kind") == "decision")
    decision["data"]["reason"] = "every verifier passed on the first try"
    return records


def _drop_executor_call(records: Records) -> Records:
    first = next(r for r in records if r.get("name") == "executor")["call_id"]
    return _renumber([r for r in records if r.get("call_id") != first])


def _swap_two_events(records: Records) -> Records:
    events = [n for n, r in enumerate(records) if r.get("kind") != "seal"]
    plan = next(k for k, n in enumerate(events) if records[n]["kind"] == "plan")
    a, b = events[plan], events[plan + 1]  # the plan and the verifier call after it
    records[a], records[b] = records[b], records[a]
    return _renumber(records)


def _truncate_tail(records: Records) -> Records:
    return records[:-2]


def _strip_seals(records: Records) -> Records:
    return _events(records)


EDITS: list[tuple[Callable[[Records], Records], set[str]]] = [
    (_earlier_start, {"trace_seal_integrity"}),
    (_decision_reason, {"trace_seal_integrity"}),
    (_drop_executor_call, {"trace_seal_integrity"}),
    (_swap_two_events, {"trace_seal_integrity", "trace_ordering"}),
    (_truncate_tail, {"trace_required_steps"}),  # cut at a seal: it reads as a crashed run
    (_strip_seals, {"trace_seal_coverage"}),
    (lambda records: records[:-1], {"trace_seal_coverage"}),  # the last seal cut off
]


def test_a_real_home_audits_clean(home: Path) -> None:
    code, violations = _audit(home)
    assert (code, violations) == (0, [])


@pytest.mark.parametrize(("edit", "kinds"), EDITS,
                         ids=[e.__name__.strip("<>") for e, _ in EDITS])
def test_an_edited_stored_trace_is_a_named_violation(
        home: Path, edit: Callable[[Records], Records], kinds: set[str]) -> None:
    _write(home, edit(_lines(home)))
    code, violations = _audit(home)
    assert code == 1, "the edited trace passed choir audit"
    assert _kinds(violations) == kinds, violations


def _session(home: Path) -> Path:
    runs = home / "artifacts" / "runs"
    return next(p for p in runs.iterdir() if p.name.startswith("verify-") and
                (p / "manifest.json").is_file() and
                json.loads((p / "manifest.json").read_text()).get("kind") == "verify_session")


def _flip_digit(path: Path, field: str) -> None:
    text = path.read_text()
    at = text.index(f'"{field}": ') + len(f'"{field}": ')
    while not text[at].isdigit():
        at += 1
    digit = "1" if text[at] != "1" else "2"
    path.chmod(0o644)
    path.write_text(text[:at] + digit + text[at + 1:])


def test_a_byte_flipped_in_a_session_manifest_is_a_named_violation(home: Path) -> None:
    _flip_digit(_session(home) / "manifest.json", "duration_ms")
    code, violations = _audit(home)
    assert code == 1, "the edited session manifest passed choir audit"
    assert _kinds(violations) == {"session_seal"}


def _export(home: Path, tmp: Path) -> dict[str, Any]:
    out = tmp / "t1.trace.json"
    proc = _choir(home, "trace", "export", "t1", "-o", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    raw: dict[str, Any] = json.loads(out.read_text())
    return raw


def _trace_verify(home: Path, tmp: Path, raw: dict[str, Any]) -> tuple[int, Any]:
    path = tmp / "edited.trace.json"
    path.write_text(json.dumps(raw))
    proc = _choir(home, "trace", "verify", str(path), "--json", timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _rewrite_assert_text(raw: dict[str, Any]) -> None:
    claim = next(c for c in raw["claims"] if c["kind"] == "ASSERT")
    status, _, rest = claim["text"].partition(": ")
    marker = rest[rest.index(" [@"):] if " [@" in rest else ""
    claim["text"] = f"{status}: the whole module is proven correct{marker}"


def _rewrite_work_item(raw: dict[str, Any]) -> None:
    raw["work_item"] = "some-other-item"


def _first_event(raw: dict[str, Any], kind: str, name: str | None = None) -> dict[str, Any]:
    return next(e for e in raw["events"] if e["kind"] == kind
                and (name is None or e["name"] == name))


def _rewrite_verdict(raw: dict[str, Any]) -> None:
    _first_event(raw, "tool_result", "unit")["data"]["result"] = "PASS"


def _rewrite_tree(raw: dict[str, Any]) -> None:
    _first_event(raw, "tool_result", "executor")["data"]["tree_hash"] = "ab" * 32


def _rewrite_attestation_id(raw: dict[str, Any]) -> None:
    _first_event(raw, "attestation")["name"] = "cd" * 32


def _drop_required(raw: dict[str, Any]) -> None:
    raw["plan"]["planned"] = raw["plan"]["planned"][:1]


def _rewrite_outcome(raw: dict[str, Any]) -> None:
    raw["outcome"]["reason"] = "verified by hand"


def _drop_claim(raw: dict[str, Any]) -> None:
    raw["claims"] = [c for c in raw["claims"] if c["kind"] != "HYPOTHESIZE"]


def _forged_seal(raw: dict[str, Any]) -> None:
    seal = raw["seals"][-1]
    seal["signature"] = ("A" if seal["signature"][0] != "A" else "B") + seal["signature"][1:]


def _relabelled_agent(raw: dict[str, Any]) -> None:
    raw["source"] = "agent"
    raw["seals"] = []


def _attestation_deleted(raw: dict[str, Any], home: Path) -> None:
    (home / "attestations" / f"{_first_event(raw, 'attestation')['name']}.json").unlink()


TRACE_EDITS: list[tuple[Callable[[dict[str, Any]], None], set[str]]] = [
    (_rewrite_assert_text, {"derived"}),
    (_rewrite_work_item, {"derived", "attestations"}),
    (_rewrite_verdict, {"seal_integrity", "attestations"}),
    (_rewrite_tree, {"seal_integrity", "attestations"}),
    (_rewrite_attestation_id, {"seal_integrity", "attestations", "derived"}),
    (_drop_required, {"derived"}),
    (_rewrite_outcome, {"derived"}),
    (_drop_claim, {"derived"}),
    (_forged_seal, {"seal_integrity"}),
    (_relabelled_agent, {"derived"}),
]


@pytest.mark.parametrize(("edit", "checks"), TRACE_EDITS,
                         ids=[e.__name__ for e, _ in TRACE_EDITS])
def test_a_rewritten_exported_trace_fails_trace_verify(
        home: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None],
        checks: set[str]) -> None:
    raw = _export(home, tmp_path)
    assert _trace_verify(home, tmp_path, raw)[0] == 0
    edit(raw)
    code, report = _trace_verify(home, tmp_path, raw)
    assert code == 1, "the rewritten trace passed choir trace verify"
    assert {f["check"] for f in report["failures"]} == checks, report["failures"]
    assert not any(c["passed"] for c in report["checks"] if c["name"] in checks)


def test_a_trace_citing_a_deleted_attestation_fails_trace_verify(home: Path,
                                                                 tmp_path: Path) -> None:
    raw = _export(home, tmp_path)
    _attestation_deleted(raw, home)
    code, report = _trace_verify(home, tmp_path, raw)
    assert code == 1
    assert {f["check"] for f in report["failures"]} == {"attestations"}, report["failures"]
    assert "not in the attestation store" in report["failures"][0]["detail"]


def test_a_session_whose_seal_or_folder_is_gone_is_named(home: Path) -> None:
    session = _session(home)
    (session / "seal.json").unlink()
    code, violations = _audit(home)
    assert code == 1 and [(v["kind"], v["found"]) for v in violations] == [
        ("session_seal", "absent")]
    shutil.rmtree(session)
    code, violations = _audit(home)
    assert code == 1 and [(v["kind"], v["object"]) for v in violations] == [
        ("session_missing", session.name)]


def test_a_seal_moved_from_the_trace_to_the_session_does_not_hold(home: Path) -> None:
    """A seal is bound to its kind and subject: one over other bytes never vouches."""
    session = _session(home)
    seal = next(r["seal"] for r in _lines(home) if r.get("kind") == "seal")
    (session / "seal.json").chmod(0o644)
    (session / "seal.json").write_text(json.dumps(seal))
    code, violations = _audit(home)
    assert code == 1 and [v["kind"] for v in violations] == ["session_seal"]
    assert "not of verify_session" in violations[0]["found"]


def _crashed_run(tmp_path: Path) -> tuple[Path, Path]:
    """A real run killed (SIGKILL) between a node's trace lines and their seal."""
    from choir._core.failpoints import ENV

    home = tmp_path / "home"
    home.mkdir()
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    crashed = _choir(home, "run", str(item), "--run-id", "k1", env={ENV: "trace:sealing"})
    assert crashed.returncode == -9, crashed.stderr
    return home, item


@pytest.mark.slow  # kill -9 and resume: the slow stage, like the orchestrator's
def test_a_run_killed_between_trace_lines_is_named_until_resumed(tmp_path: Path) -> None:
    home, _ = _crashed_run(tmp_path)
    records = [json.loads(x) for x in (home / "traces" / "k1.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] != "seal"  # the node's events are there, their seal is not
    code, violations = _audit(home)
    assert code == 1
    assert _kinds(violations) == {"trace_seal_coverage", "trace_required_steps"}, violations
    assert all("choir run --resume k1" in v["found"] for v in violations)
    resumed = _choir(home, "run", "--resume", "k1", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert _audit(home) == (0, [])


@pytest.mark.slow  # kill -9 and resume: the slow stage, like the orchestrator's
def test_a_crashed_run_whose_sealed_trace_was_changed_is_not_resumed(tmp_path: Path) -> None:
    home, _ = _crashed_run(tmp_path)
    path = home / "traces" / "k1.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()]
    records[0]["data"]["mood"] = "BOLD"  # run_started: sealed on its own
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, violations = _audit(home)
    assert code == 1 and "trace_seal_integrity" in _kinds(violations)
    resumed = _choir(home, "run", "--resume", "k1")
    assert resumed.returncode == 2 and "changed after it was sealed" in resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert path.read_text().count("\n") == len(records)  # nothing appended, nothing sealed


@pytest.mark.slow  # kill -9 and resume: the slow stage, like the orchestrator's
def test_a_torn_last_line_is_cut_when_the_run_resumes(tmp_path: Path) -> None:
    """A write the disk did not finish (no newline): audit names it, the resume cuts it."""
    home, _ = _crashed_run(tmp_path)
    path = home / "traces" / "k1.jsonl"
    with path.open("a") as fh:
        fh.write('{"kind":"tool_call","seq":')
    code, violations = _audit(home)
    assert code == 1 and [v["kind"] for v in violations] == ["trace_unreadable"]
    resumed = _choir(home, "run", "--resume", "k1", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert _audit(home) == (0, [])


@pytest.mark.slow  # kill -9 and resume: the slow stage, like the orchestrator's
def test_a_run_killed_before_its_first_checkpoint_is_started_again(tmp_path: Path) -> None:
    """Killed after ``run_started`` was sealed but before the graph's first checkpoint:
    there is no run to resume; starting the item again under the same id continues the
    record, and audit is clean."""
    from choir.attest import load_signer
    from choir.trace.record import TraceRecorder

    home = tmp_path / "home"
    home.mkdir()
    item = make_item(tmp_path, executor=fix_cmd(tmp_path))
    recorder = TraceRecorder("k2", home, signer=load_signer(home))
    recorder.emit("run_started", name="fix-add", data={"work_item": "fix-add",
                                                       "mood": "CALM", "required": []})
    recorder._commit()
    code, violations = _audit(home)
    assert code == 1 and _kinds(violations) == {"trace_required_steps"}
    assert _choir(home, "run", "--resume", "k2").returncode == 2  # no run to resume
    again = _choir(home, "run", str(item), "--run-id", "k2", "--json")
    assert again.returncode == 0, again.stderr
    assert _audit(home) == (0, [])


@pytest.mark.parametrize("plant", ["fifo", "symlink"])
def test_a_planted_record_is_never_followed_or_waited_on(home: Path, plant: str) -> None:
    """A FIFO would hang audit, a link would read another file as the record."""
    trace, seal = _trace_file(home), _session(home) / "seal.json"
    for path in (trace, seal):
        copy = path.with_name(path.name + ".real")
        path.rename(copy)
        if plant == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(copy)
    code, violations = _audit(home)
    assert code == 1
    kinds = {v["kind"]: v["found"] for v in violations if v["kind"] != "session_extra_file"}
    assert set(kinds) == {"trace_unreadable", "session_seal"}, violations
    assert all("not a" in found for found in kinds.values()), kinds


@pytest.mark.slow  # kill -9 and resume: the slow stage, like the orchestrator's
def test_seals_remade_over_a_changed_record_are_caught_and_not_laundered(tmp_path: Path
                                                                         ) -> None:
    """The attacker changes a sealed event and rewrites every seal's digest to the new chain
    (keeping the signatures: they cannot make new ones). Audit names it, and a resume, whose
    first seal would be genuine and cover everything, refuses."""
    from choir.trace.chain import chain_heads
    from choir.trace.record import read_trace

    home, _ = _crashed_run(tmp_path)
    path = home / "traces" / "k1.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()]
    records[0]["data"]["mood"] = "BOLD"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    heads = chain_heads("k1", read_trace(path)[0])
    for record in records:
        if record["kind"] == "seal":
            record["seal"]["digest"] = heads[record["seal"]["seq"]]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, violations = _audit(home)
    assert code == 1 and "trace_seal_integrity" in _kinds(violations)
    assert "signature does not verify" in next(
        v["found"] for v in violations if v["kind"] == "trace_seal_integrity")
    resumed = _choir(home, "run", "--resume", "k1")
    assert resumed.returncode == 2 and "changed after it was sealed" in resumed.stderr
    assert "trace_seal_integrity" in _kinds(_audit(home)[1])
