"""``choir verify`` end to end: a real repo, a real sandbox, the exact output contract."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import forked
from tests.workitems import PYTEST

CHOIR = [sys.executable, "-m", "choir"]

CALC_OK = "def add(a, b):\n    return a + b\n"
CALC_BUG = "def add(a, b):\n    return a - b\n"
TEST_CALC = textwrap.dedent(
    """\
    from calc import add

    def test_add():
        assert add(2, 3) == 5

    def test_add_zero():
        assert add(0, 0) == 0
    """
)
CHOIR_YAML = textwrap.dedent(
    """\
    verifiers:
      unit:
        kind: unit_tests
        steps:
          - name: pytest
            command: {pytest} --junitxml=$CHOIR_OUT/junit.xml
        parser: junit
        timeout_s: 120
      lint:
        kind: lint
        steps:
          - name: compile
            command: {python} -c "import ast; ast.parse(open('calc.py').read(), 'calc.py')"
    """
)


def sandbox_name() -> str:
    return "bwrap" if shutil.which("bwrap") else "local"


def make_repo(path: Path, calc: str) -> Path:
    path.mkdir()
    (path / "calc.py").write_text(calc)
    (path / "test_calc.py").write_text(TEST_CALC)
    # the base interpreter: a sandboxed step never sees Choir's own venv (#16.7)
    (path / "choir.yaml").write_text(CHOIR_YAML.format(pytest=PYTEST,
                                                     python=os.path.realpath(sys.executable)))
    return path


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return forked.run([*CHOIR, *args], capture_output=True, text=True, cwd=cwd, env=env,
                      timeout=300)


CONTRACT_KEYS = {"status", "run_id", "tail_log", "artifact_paths", "summary", "manifest", "mood",
                 "plan", "reports", "attestations"}


def test_verify_pass_prints_the_contract_and_exits_0(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", CALC_OK)
    before = {p.name: p.read_bytes() for p in repo.iterdir()}
    proc = run("verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name(),
               "--mood", "SKEPTICAL")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) >= CONTRACT_KEYS
    assert out["status"] == "PASS" and out["mood"] == "SKEPTICAL"
    assert sorted(out["plan"]) == ["lint", "unit"]
    assert [r["result"] for r in out["reports"]] == ["PASS", "PASS"]
    assert len(out["attestations"]) == 2
    unit = next(r for r in out["reports"] if r["verifier"] == "unit")
    assert unit["counts"]["run"] == 2 and unit["counts"]["failed"] == 0
    commands = out["manifest"]["commands_executed"]
    assert {(c["verifier"], c["name"]) for c in commands} == {("unit", "pytest"),
                                                              ("lint", "compile")}
    assert all(c["exit_code"] == 0 and c["duration_ms"] >= 0 for c in commands)
    assert out["manifest"]["platform"]["sandbox"] == sandbox_name()
    for path in out["artifact_paths"]:
        assert (Path(path) / "manifest.json").is_file()
        assert (Path(path) / "logs" / "combined.log").is_file()
    # the repo is untouched by verification
    assert {p.name: p.read_bytes() for p in repo.iterdir()} == before
    assert run("audit").returncode == 0


def test_verify_fail_exits_1_with_signatures(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", CALC_BUG)
    proc = run("verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name())
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "FAIL" and out["plan"] == ["unit"]
    report = out["reports"][0]
    assert report["result"] == "FAIL"
    assert report["counts"]["failed"] == 1
    assert any("test_add" in (s.get("test_id") or "") for s in report["failure_signatures"])
    assert len(out["tail_log"].splitlines()) <= 200
    assert len(json.dumps(report)) < 4096


def test_verify_attestation_can_be_shown_and_exported(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", CALC_OK)
    out = json.loads(run("verify", "--repo", str(repo), "--json", "--sandbox",
                         sandbox_name()).stdout)
    att_id = out["attestations"][0]
    shown = json.loads(run("attest", "show", att_id[:16]).stdout)
    assert shown["id"] == att_id and shown["body"]["result"] == "PASS"
    assert shown["body"]["environment"]["sandbox"] == sandbox_name()
    envelope = json.loads(run("attest", "show", att_id, "--in-toto").stdout)
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    assert envelope["signatures"][0]["sig"]


@pytest.mark.parametrize(
    ("choir_yaml", "needle"),
    [
        ("verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n      - name: t\n", "command"),
        ("verifiers:\n  unit:\n    kind: unit_tests\n    timeout_s: -1\n    steps:\n"
         "      - {name: t, command: touch RAN}\n", "timeout_s"),
        ("verifiers:\n  unit:\n    kind: unit_tests\n    stepz: []\n", "did you mean"),
        ("verifiers: [\n", "invalid YAML"),
    ],
)
def test_bad_config_exits_2_naming_file_and_line_and_runs_nothing(
    tmp_path: Path, choir_yaml: str, needle: str
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(choir_yaml)
    proc = run("verify", "--repo", str(repo))
    assert proc.returncode == 2
    assert f"{repo / 'choir.yaml'}:" in proc.stderr and needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (repo / "RAN").exists()
    assert not (Path(os.environ["CHOIR_ARTIFACT_DIR"]) / "runs").exists()


def test_missing_repo_exits_2(tmp_path: Path) -> None:
    proc = run("verify", "--repo", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_paranoid_refuses_the_unsafe_local_sandbox(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", CALC_OK)
    proc = run("verify", "--repo", str(repo), "--sandbox", "local", "--mood", "PARANOID")
    assert proc.returncode == 2 and "refuses" in proc.stderr
    assert not (Path(os.environ["CHOIR_ARTIFACT_DIR"]) / "runs").exists()


@pytest.mark.parametrize(("calc", "plan", "code"), [(CALC_OK, ["unit", "lint"], 0),
                                                   (CALC_BUG, ["unit"], 1)])
def test_bold_verify_broadens_only_once_the_core_is_green(tmp_path: Path, calc: str,
                                                          plan: list[str], code: int) -> None:
    repo = make_repo(tmp_path / "repo", calc)
    proc = run("verify", "--repo", str(repo), "--mood", "BOLD", "--sandbox", sandbox_name(),
               "--json")
    assert proc.returncode == code, proc.stderr
    out = json.loads(proc.stdout)
    assert out["plan"] == plan and [r["verifier"] for r in out["reports"]] == plan
    assert len(out["attestations"]) == len(plan)


def test_seed001_contract_run_id_is_a_real_run_folder(tmp_path: Path, choir_home: Path) -> None:
    """seed 001: run_id names runs/{run_id}/manifest.json; commands are named by step."""
    repo = make_repo(tmp_path / "repo", CALC_OK)
    proc = run("verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name(),
               "--mood", "SKEPTICAL")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    folder = choir_home / "artifacts" / "runs" / out["run_id"]
    stored = json.loads((folder / "manifest.json").read_text())
    assert stored == out["manifest"]
    assert stored["run_id"] == out["run_id"] and stored["status"] == "PASS"
    steps = {c["verifier"]: c for c in stored["commands_executed"]}
    assert steps["unit"]["name"] == "pytest" and steps["lint"]["name"] == "compile"
    for c in stored["commands_executed"]:  # each names the verifier run that holds its logs
        assert Path(out["artifact_paths"][0]).parent.joinpath(c["run_id"]).is_dir()
    # ... and the seed-001 layout is there under the run_id given: a step log per command,
    # numbered in commands_executed order, and the combined log of the whole session
    names = [f"step-{i:02d}-{c['name']}.log"
             for i, c in enumerate(stored["commands_executed"], start=1)]
    assert sorted(p.name for p in (folder / "logs").iterdir()) == sorted(
        [*names, "combined.log"])
    for name, c in zip(names, stored["commands_executed"], strict=True):
        own = Path(out["artifact_paths"][0]).parent / c["run_id"] / "logs"
        assert (folder / "logs" / name).read_bytes() == next(own.glob("step-*.log")).read_bytes()
    combined = (folder / "logs" / "combined.log").read_text()
    assert all(f"==> {c['run_id']} <==" in combined for c in stored["commands_executed"])
    assert "passed" in combined  # pytest's own output, whole
    assert run("audit").returncode == 0


def test_audit_catches_a_forged_verify_session_manifest(tmp_path: Path, choir_home: Path) -> None:
    """Attack: rewrite a FAIL session's manifest to say PASS and point at other runs."""
    good = make_repo(tmp_path / "good", CALC_OK)
    bad = make_repo(tmp_path / "bad", CALC_BUG)
    passed = json.loads(run("verify", "--repo", str(good), "--json", "--sandbox",
                            sandbox_name()).stdout)
    failed = json.loads(run("verify", "--repo", str(bad), "--json", "--sandbox",
                            sandbox_name()).stdout)
    assert failed["status"] == "FAIL" and run("audit").returncode == 0
    path = choir_home / "artifacts" / "runs" / failed["run_id"] / "manifest.json"
    forged = dict(json.loads(path.read_text()), status="PASS", runs={"x-unit-0": "0" * 64})
    path.chmod(0o644)
    path.write_text(json.dumps(forged))
    proc = run("audit", "--json")
    assert proc.returncode == 1
    assert failed["run_id"] in proc.stdout and passed["run_id"] not in proc.stdout


def test_an_inconclusive_only_session_says_so_and_exits_4(tmp_path: Path) -> None:
    # no verifier failed (the tool is missing): printing FAIL sent users chasing a bug that is
    # not there; the seed-001 `status` stays PASS/FAIL, `verdict` and the exit code tell
    repo = make_repo(tmp_path / "repo", CALC_OK)
    (repo / "choir.yaml").write_text(
        "verifiers:\n  types:\n    kind: typecheck\n    steps:\n"
        "      - {name: check, command: no_such_checker_xyz .}\n")
    proc = run("verify", "--repo", str(repo), "--sandbox", sandbox_name())
    assert proc.returncode == 4, proc.stdout + proc.stderr
    last = [line for line in proc.stdout.splitlines() if "attestations:" in line]
    assert last and last[0].startswith("INCONCLUSIVE"), proc.stdout
    out = json.loads(run("verify", "--repo", str(repo), "--json",
                         "--sandbox", sandbox_name()).stdout)
    assert out["verdict"] == "INCONCLUSIVE" and out["status"] == "FAIL"


def test_session_verdict_over_every_mix() -> None:
    from choir.app.verify import session_verdict
    from choir.models import Result

    p, f, x, i = Result.PASS, Result.FAIL, Result.FLAKY, Result.INCONCLUSIVE
    assert session_verdict([p, p]) == "PASS"
    assert session_verdict([p, i]) == "INCONCLUSIVE"
    assert session_verdict([i, f]) == "FAIL" and session_verdict([i, x]) == "FAIL"
    assert session_verdict([p], crashed=1) == "FAIL"
    assert session_verdict([]) == "FAIL"


def test_audit_rederives_a_sessions_seed001_logs(tmp_path: Path, choir_home: Path) -> None:
    """The session's logs are copies of attested runs' logs: any edit, plant or deletion is
    a violation, so the layout can never carry bytes that no verifier produced."""
    import shutil as sh

    repo = make_repo(tmp_path / "repo", CALC_OK)
    out = json.loads(run("verify", "--repo", str(repo), "--json", "--sandbox",
                         sandbox_name()).stdout)
    logs = choir_home / "artifacts" / "runs" / out["run_id"] / "logs"
    assert run("audit").returncode == 0
    saved = tmp_path / "saved"
    sh.copytree(logs, saved)
    def append() -> None:
        (logs / "combined.log").chmod(0o644)
        with (logs / "combined.log").open("a") as fh:
            fh.write("all tests passed\n")

    for attack, expect in (
            (append, "session_log"),
            (lambda: (logs / "step-09-planted.log").write_text("x"), "session_log_extra"),
            (lambda: sh.rmtree(logs), "session_log")):
        attack()
        audited = run("audit")
        assert audited.returncode == 1 and expect in audited.stdout, audited.stdout
        sh.rmtree(logs, ignore_errors=True)
        sh.copytree(saved, logs)
    assert run("audit").returncode == 0


def _git_repo(path: Path, calc: str) -> Path:
    repo = make_repo(path, calc)
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


def test_a_verified_tree_can_be_gated_with_a_claim(tmp_path: Path) -> None:
    # only `choir run` work items reached the AHDB: `choir gate NAME --commit HEAD` after a
    # passing `choir verify` said "signed by key none" and never opened
    repo = _git_repo(tmp_path / "repo", CALC_OK)
    before = run("gate", "ci-main", "--repo", str(repo))
    assert before.returncode == 1 and "choir verify --claim ci-main" in before.stdout
    assert "key none" not in before.stdout
    proc = run("verify", "--repo", str(repo), "--sandbox", sandbox_name(), "--claim", "ci-main",
               "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["claim"]["asserted"]
    opened = run("gate", "ci-main", "--repo", str(repo))
    assert opened.returncode == 0 and "gate: recorded by a claim (choir verify --claim" in \
        opened.stdout, opened.stdout
    assert run("gate", "ci-main", "--repo", str(repo), "--commit", "HEAD").returncode == 0
    # a different tree is not covered, and a FAIL of this claim's tree demotes it
    (repo / "calc.py").write_text(CALC_BUG)
    assert run("gate", "ci-main", "--repo", str(repo)).returncode == 1
    failed = run("verify", "--repo", str(repo), "--sandbox", sandbox_name(), "--claim",
                 "ci-main", "--json")
    assert failed.returncode == 1 and json.loads(failed.stdout)["claim"]["asserted"] is None
    assert run("gate", "ci-main", "--repo", str(repo)).returncode == 1
    assert run("audit").returncode == 0


def test_a_bad_claim_name_is_exit_2_before_anything_runs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", CALC_OK)
    proc = run("verify", "--repo", str(repo), "--claim", "../x")
    assert proc.returncode == 2 and "--claim" in proc.stderr and "fix:" in proc.stderr


def test_a_claim_and_a_run_never_share_a_work_item_id(tmp_path: Path) -> None:
    """Found by a review: an agent's verify over MCP (or `choir verify --claim`) named its
    claim after a `choir run` work item, `deploy`, in CALM with one verifier: `choir gate
    deploy` then opened, though the item required a verifier that failed and a person's
    approval. A run refuses an id a claim holds, and a claim refuses an id a run has
    recorded; the gate answers for one of them only."""
    repo = _git_repo(tmp_path / "repo", CALC_OK)
    claimed = run("verify", "--repo", str(repo), "--sandbox", sandbox_name(), "--claim",
                  "deploy", "--json")
    assert claimed.returncode == 0 and json.loads(claimed.stdout)["claim"]["asserted"]
    item = tmp_path / "item.yaml"
    item.write_text("id: deploy\ngoal: ship it\nrepo: ./repo\nexecutor: {kind: command, "
                    "command: 'true'}\n")
    refused = run("run", str(item))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "holds a claim of that name" in refused.stderr and "fix:" in refused.stderr
    item.write_text(item.read_text().replace("id: deploy", "id: ship"))
    ran = run("run", str(item))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    gated = run("gate", "ship", "--repo", str(repo))
    assert gated.returncode == 0 and "gate: recorded by choir run" in gated.stdout, gated.stdout
    again = run("verify", "--repo", str(repo), "--sandbox", sandbox_name(), "--claim", "ship")
    assert again.returncode == 2 and "`choir run` work item of that id" in again.stderr
