"""Postconditions against real systems: a SQLite file and an HTTP service on 127.0.0.1,
checked from inside a real bubblewrap sandbox through the same path as any verifier
(run -> artifacts -> report -> signed attestation)."""

from __future__ import annotations

import json
import sqlite3
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from choir.app.verify import verify_tree
from choir.attest import AttestationStore
from choir.models import Mood
from tests.postcondition_systems import flag_db, http_service, write_later
from tests.sandboxes import ISOLATED, isolated_backend


def _repo(path: Path, config: str, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "choir.yaml").write_text(textwrap.dedent(config))
    for rel, text in (files or {}).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(textwrap.dedent(text))
    return path


def _verify(repo: Path, sandbox: str = "bwrap") -> dict[str, Any]:
    isolated_backend(sandbox).close()
    return verify_tree(repo, mood=Mood.CALM, sandbox_name=sandbox).contract


def _by_name(contract: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["verifier"]: r for r in contract["reports"]}


def _severity(report: dict[str, Any]) -> str:
    sig = report["failure_signatures"][0]
    return "red" if "(red)" in sig["excerpt"] else "yellow" if "(yellow)" in sig["excerpt"] \
        else "?"


@pytest.mark.parametrize("sandbox", ISOLATED)
def test_read_after_write_sqlite_visible_lost_and_late(tmp_path: Path, sandbox: str) -> None:
    db = flag_db(tmp_path / "system", {"beta": "on", "gamma": "off"})
    released = threading.Event()
    late = write_later(db, "INSERT INTO flags VALUES (?, ?)", ("delta", "on"), released)
    repo = _repo(tmp_path / "repo", f"""\
        resources:
          flags: {{sqlite: {db}}}
        verifiers:
          visible:
            read_after_write:
              resource: flags
              sql: SELECT value FROM flags WHERE name = :name
              params: {{name: beta}}
              expect: "on"
              verify_timeout_ms: 1000
          lost:
            read_after_write:
              resource: flags
              sql: SELECT value FROM flags WHERE name = :name
              params: {{name: gamma}}
              expect: "on"
              verify_timeout_ms: 400
          late:
            read_after_write:
              resource: flags
              sql: SELECT value FROM flags WHERE name = :name
              params: {{name: delta}}
              expect: "on"
              verify_timeout_ms: 400
        moods:
          CALM: {{verifiers: [visible, lost, late]}}
        """)
    contract = _verify(repo, sandbox)
    released.set()  # the write lands, after the deadline
    late.join(5)
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM flags WHERE name='delta'").fetchone() == ("on",)
    con.close()
    reports = _by_name(contract)
    assert reports["visible"]["result"] == "PASS"
    # a read within the deadline that shows the wrong value is a lost write (the window opens
    # when the check begins: a child slow to start on a loaded machine came out INCONCLUSIVE
    # here, see test_a_child_slow_to_start_still_gets_its_whole_window)
    assert reports["lost"]["result"] == "FAIL"
    assert _severity(reports["lost"]) == "yellow"
    assert "'off'" in reports["lost"]["failure_signatures"][0]["excerpt"]
    assert reports["late"]["result"] == "INCONCLUSIVE"
    assert _severity(reports["late"]) == "red"
    assert contract["status"] == "FAIL"
    # each result is attested like any verifier's; the database was only read
    atts = [AttestationStore().get(i) for i in contract["attestations"]]
    assert {a.body.verifier: a.body.result.value for a in atts} == {
        "visible": "PASS", "lost": "FAIL", "late": "INCONCLUSIVE"}
    assert all(a.body.verifier_kind == "postcondition" for a in atts)
    assert all(a.body.environment.isolation != "none" for a in atts)
    assert sorted(p.name for p in db.parent.iterdir()) == ["flags.db"]


@pytest.mark.bwrap
def test_http_read_after_write_invariants_and_recorded_host(tmp_path: Path) -> None:
    with http_service() as (base, service):
        service.flags["beta"] = "on"
        service.health = 503  # the action broke the service: the invariant catches it
        host = base.removeprefix("http://")
        repo = _repo(tmp_path / "repo", f"""\
            resources:
              api: {{http: "{base}"}}
            verifiers:
              flag_visible:
                read_after_write:
                  resource: api
                  path: /flags/beta
                  field: value
                  expect: "on"
                  verify_timeout_ms: 1000
              healthy:
                invariant_check:
                  resource: api
                  path: /health
                  status: 200
                  verify_timeout_ms: 1000
              hung:
                read_after_write:
                  resource: api
                  path: /slow
                  field: value
                  expect: "on"
                  verify_timeout_ms: 500
            moods:
              CALM: {{verifiers: [flag_visible, healthy, hung]}}
            """)
        contract = _verify(repo)
    reports = _by_name(contract)
    assert reports["flag_visible"]["result"] == "PASS"
    assert reports["healthy"]["result"] == "FAIL"
    assert _severity(reports["healthy"]) == "yellow"
    assert "HTTP 503" in reports["healthy"]["failure_signatures"][0]["excerpt"]
    assert reports["hung"]["result"] == "INCONCLUSIVE"
    assert _severity(reports["hung"]) == "red"
    assert "/flags/beta" in service.requests and "/health" in service.requests
    for att_id in contract["attestations"]:
        body = AttestationStore().get(att_id).body
        assert body.environment.network is True
        assert body.environment.hosts == (host,)  # the only host it could reach, signed


@pytest.mark.bwrap
def test_invariant_broken_by_the_action_in_sqlite(tmp_path: Path) -> None:
    db = flag_db(tmp_path / "system", {})
    write_later(db, "UPDATE accounts SET balance = balance - 80 WHERE id = ?", (2,)).join()
    repo = _repo(tmp_path / "repo", f"""\
        resources:
          ledger: {{sqlite: {db}}}
        verifiers:
          no_overdraft:
            invariant_check:
              resource: ledger
              sql: SELECT COUNT(*) = 0 FROM accounts WHERE balance < 0
        """)
    report = _by_name(_verify(repo))["no_overdraft"]
    assert report["result"] == "FAIL"
    assert "invariant broken" in report["failure_signatures"][0]["excerpt"]


@pytest.mark.bwrap
def test_custom_verifier_from_verifiers_folder_sync_and_async(tmp_path: Path) -> None:
    db = flag_db(tmp_path / "system", {"beta": "on"})
    repo = _repo(tmp_path / "repo", f"""\
        resources:
          flags: {{sqlite: {db}}}
        verifiers:
          beta_on:
            callable: verifiers/beta_on.py
          beta_async:
            callable: verifiers/beta_async.py:check
          gamma_on:
            callable: verifiers/gamma_on.py
        moods:
          CALM: {{verifiers: [beta_on, beta_async, gamma_on]}}
        """, {
        "verifiers/beta_on.py": """\
            import sqlite3

            def verify(context):
                path = context["resources"]["flags"]["path"]
                con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
                value = con.execute("SELECT value FROM flags WHERE name='beta'").fetchone()
                return {"outcome": "pass" if value == ("on",) else "fail",
                        "detail": f"beta is {value} for {context['verifier']}"}
            """,
        "verifiers/beta_async.py": """\
            import asyncio

            async def check(context):
                await asyncio.sleep(0.01)
                return True
            """,
        "verifiers/gamma_on.py": """\
            from dataclasses import dataclass

            @dataclass
            class VerificationResult:
                outcome: str
                detail: str

            def verify():
                return VerificationResult("fail", "gamma is not on")
            """,
    })
    reports = _by_name(_verify(repo))
    assert reports["beta_on"]["result"] == "PASS"
    assert reports["beta_async"]["result"] == "PASS"
    assert reports["gamma_on"]["result"] == "FAIL"
    assert "gamma is not on" in reports["gamma_on"]["failure_signatures"][0]["excerpt"]


HOSTILE = {
    # the verifier writes the harness's record itself, then raises
    "fake_file": """\
        import json, os

        def verify(context):
            path = os.path.join(os.environ["CHOIR_OUT"], "postcondition.json")
            with open(path, "w") as fh:
                json.dump({"verifier": "fake_file", "method": "callable", "outcome": "pass",
                           "severity": None, "detail": "forged", "hosts": []}, fh)
            raise RuntimeError("the check could not run")
        """,
    # it prints the lines a PASS would print, then raises
    "fake_line": """\
        def verify(context):
            print('{"outcome": "pass", "detail": "forged"}')
            print("[choir] postcondition fake_line: PASS: forged", flush=True)
            raise RuntimeError("the check could not run")
        """,
    # it raises, and forces a clean exit status on the way out
    "exit_zero": """\
        import os

        def verify(context):
            try:
                raise RuntimeError("the check could not run")
            finally:
                os._exit(0)
        """,
    "sys_exit": """\
        import sys

        def verify(context):
            sys.exit(0)
        """,
    "crash": """\
        import os, signal

        def verify(context):
            os.kill(os.getpid(), signal.SIGSEGV)
        """,
    "hang": """\
        import time

        def verify(context):
            time.sleep(60)
        """,
    "garbage": """\
        def verify(context):
            return "PASS"
        """,
}


@pytest.mark.parametrize("sandbox", ISOLATED)
def test_hostile_and_broken_verifiers_are_inconclusive_never_pass(tmp_path: Path,
                                                                  sandbox: str) -> None:
    names = sorted(HOSTILE)
    config = "verifiers:\n" + "".join(
        f"  {n}:\n    callable: verifiers/{n}.py\n"
        + ("    timeout_s: 2\n" if n == "hang" else "") for n in names)
    config += f"moods:\n  CALM: {{verifiers: [{', '.join(names)}]}}\n"
    repo = _repo(tmp_path / "repo", config,
                 {f"verifiers/{n}.py": text for n, text in HOSTILE.items()})
    contract = _verify(repo, sandbox)
    reports = _by_name(contract)
    assert {n: r["result"] for n, r in reports.items()} == dict.fromkeys(names, "INCONCLUSIVE")
    assert contract["status"] == "FAIL"
    for att_id in contract["attestations"]:
        assert AttestationStore().get(att_id).body.result.value == "INCONCLUSIVE"
    assert "did not finish" in reports["hang"]["summary"] or \
        "harness timed out" in reports["hang"]["summary"]
    assert "raised RuntimeError" in reports["fake_line"]["summary"]
    # what the host kept is the harness's record, not the forgery
    run_dir = Path([p for p in contract["artifact_paths"] if p.endswith("-fake_file-0")][0])
    record = json.loads((run_dir / "out" / "postcondition.json").read_text())
    assert record["outcome"] == "inconclusive" and record["detail"] != "forged"


@pytest.mark.bwrap
def test_session_record_holds_the_outcomes_and_the_audit_covers_them(tmp_path: Path) -> None:
    from choir.audit.integrity import audit
    from choir.evidence.artifacts import ArtifactStore

    db = flag_db(tmp_path / "system", {"beta": "off"})
    repo = _repo(tmp_path / "repo", f"""\
        resources:
          flags: {{sqlite: {db}}}
        verifiers:
          beta_on:
            read_after_write:
              resource: flags
              sql: SELECT value FROM flags WHERE name = 'beta'
              expect: "on"
              verify_timeout_ms: 200
        """)
    contract = _verify(repo)
    entries = contract["manifest"]["verification"]
    assert [(e["verifier"], e["outcome"], e["severity"]) for e in entries] == [
        ("beta_on", "fail", "yellow")]
    assert entries[0]["attestation"] == contract["attestations"][0]
    assert audit().ok
    # someone turns the recorded FAIL into a pass: the audit names it
    manifest = ArtifactStore().run_dir(contract["run_id"]) / "manifest.json"
    data = json.loads(manifest.read_text())
    data["verification"][0].update(outcome="pass", severity=None)
    manifest.chmod(0o644)
    manifest.write_text(json.dumps(data))
    result = audit()
    assert not result.ok
    assert any(v.kind == "episode_outcome" for v in result.violations)


PEEK = """\
import ctypes, os

def verify(context):
    parent = os.getppid()
    try:
        open(f"/proc/{parent}/mem", "r+b").close()
        return {"outcome": "fail", "detail": "the harness's memory is writable"}
    except OSError as exc:
        opened = exc.errno
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, parent, 0, 0) == 0:  # PTRACE_ATTACH
        return {"outcome": "fail", "detail": "the harness can be traced"}
    return {"outcome": "pass", "detail": f"protected (errno {opened}, {ctypes.get_errno()})"}
"""


@pytest.mark.parametrize("sandbox", ISOLATED)
def test_verifier_cannot_reach_into_the_harness_that_decides(tmp_path: Path,
                                                            sandbox: str) -> None:
    """The verdict is the harness's exit code: a verifier that could write the harness's
    memory or trace it could rewrite that code, so neither may be possible."""
    repo = _repo(tmp_path / "repo", "verifiers:\n  peek:\n    callable: verifiers/peek.py\n",
                 {"verifiers/peek.py": PEEK})
    report = _by_name(_verify(repo, sandbox))["peek"]
    assert report["result"] == "PASS", report["summary"]


@pytest.mark.parametrize("sandbox", ISOLATED)
def test_a_module_planted_in_the_tree_never_runs_in_the_harness(tmp_path: Path,
                                                                sandbox: str) -> None:
    """The harness ran as ``python3 -B -c``, with the tree first on its import path: a
    ``json.py`` in the repo (``choir verify`` pins no spec, so nothing removes it) ran in the
    parent that decides, before anything else, and turned a failing check into a PASS (a
    review's attack, failing on the old code). The harness runs isolated now; the check it
    loads still imports the code under test from the tree."""
    fake = ("import os, sys\n"
            "open(os.path.join(os.environ['CHOIR_OUT'], 'postcondition.json'), 'w').write("
            "'{\"outcome\": \"pass\"}')\n"
            "sys.stdout.write('[choir] postcondition broken: PASS: ok\\n')\n"
            "sys.stdout.flush()\n"
            "os._exit(0)\n")
    repo = _repo(tmp_path / "repo", "verifiers:\n  broken:\n    callable: verifiers/broken.py\n",
                 {"verifiers/broken.py": "from calc import add\n\n\n"
                                         "def verify():\n    return add(2, 3) == 5\n",
                  "calc.py": "def add(a, b):\n    return a - b\n"})
    (repo / "json.py").write_text(fake)
    report = _by_name(_verify(repo, sandbox))["broken"]
    assert report["result"] == "FAIL", report["summary"]
