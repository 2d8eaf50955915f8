"""``choir runs list/show`` and ``choir run --json``: a finished run can be inspected later
from what it stored, in a fresh process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forked
from tests.workitems import FIXED, calc_repo

CHOIR = [sys.executable, "-m", "choir"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return forked.run([*CHOIR, *args], capture_output=True, text=True, env=env, timeout=300)


def _item(tmp_path: Path) -> Path:
    """Fixes ``add`` on attempt 2; prints terminal escapes an attacker could plant."""
    sandbox = "bwrap" if shutil.which("bwrap") else "local"
    calc_repo(tmp_path / "repo", canary="runs-canary", sandbox=sandbox)
    (tmp_path / "fix.py").write_text(
        "import os, pathlib, sys\n"
        "print('\\x1b]0;pwned-title\\x07\\x1b[2Jexecutor says hi\\x1b[31m', flush=True)\n"
        "if os.environ.get('CHOIR_FEEDBACK_FILE'):\n"
        f"    pathlib.Path('calc.py').write_text({FIXED!r})\n"
        "sys.exit(0)\n")
    item = tmp_path / "item.yaml"
    item.write_text(f"id: fix-add\ngoal: add must add\nrepo: ./repo\nexecutor:\n"
                    f"  kind: command\n  command: {sys.executable} {tmp_path / 'fix.py'}\n")
    return item


@pytest.mark.slow  # a whole run or two: CI's slow stage
def test_run_json_then_runs_list_and_show(tmp_path: Path) -> None:
    proc = run("run", str(_item(tmp_path)), "--run-id", "r1", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "asserted" and out["run_id"] == "r1"
    # structured results, not only event names
    results = {a["verifier"]: a["result"] for a in out["attestations"]}
    assert results == {"unit": "PASS"}
    assert all(a["report"]["verifier"] == a["verifier"] for a in out["attestations"])
    assert all(Path(a["artifact_path"], "manifest.json").is_file() for a in out["attestations"])
    assert out["executor"]["exit_code"] == 0
    assert any(v["kind"] == "ASSERT" for v in out["verdicts"])

    listed = json.loads(run("runs", "list", "--json").stdout)
    assert [(r["run_id"], r["kind"], r["status"]) for r in listed] == [("r1", "run", "asserted")]

    shown = json.loads(run("runs", "show", "r1", "--json").stdout)
    assert shown["attempt"] == 2 and shown["work_item"] == "fix-add"
    assert shown["executor"]["exit_code"] == 0
    assert "executor says hi" in shown["executor"]["output_tail"]
    # every round's evidence, the failing first attempt included
    assert sorted(a["result"] for a in shown["attestations"]) == ["FAIL", "PASS"]
    failing = next(a for a in shown["attestations"] if a["result"] == "FAIL")
    assert any("test_add" in (s["test_id"] or "") for s in failing["report"]["failure_signatures"])

    text = run("runs", "show", "r1")
    assert text.returncode == 0
    assert "executor says hi" in text.stdout and "test_add" in text.stdout
    assert "\x1b" not in text.stdout and "\x07" not in text.stdout  # no terminal injection
    assert "executor exit code: 0" in text.stdout


def test_runs_show_a_verify_session_and_an_unknown_id(tmp_path: Path) -> None:
    repo = calc_repo(tmp_path / "repo", canary="c", sandbox="local")
    verified = json.loads(run("verify", "--repo", str(repo), "--json").stdout)
    shown = json.loads(run("runs", "show", verified["run_id"], "--json").stdout)
    assert shown["kind"] == "verify" and shown["status"] == "FAIL"
    assert [a["id"] for a in shown["attestations"]] == verified["attestations"]
    assert shown["attestations"][0]["report"]["result"] == "FAIL"
    assert run("runs", "list").stdout.startswith(verified["run_id"])
    missing = run("runs", "show", "nope")
    assert missing.returncode == 2 and "choir runs list" in missing.stderr
    assert run("runs", "show", "../etc").returncode == 2


def test_runs_show_says_when_a_sessions_record_is_not_sealed(tmp_path: Path,
                                                             choir_home: Path) -> None:
    """A session rewritten FAIL -> PASS by whoever can write the store (an executor in trust
    mode) is shown with its seal's verdict: the status printed is not vouched for. Before,
    ``runs show`` printed the forged PASS as it printed any other."""
    repo = calc_repo(tmp_path / "repo", canary="c", sandbox="local")
    session = json.loads(run("verify", "--repo", str(repo), "--json").stdout)["run_id"]
    assert json.loads(run("runs", "show", session, "--json").stdout)["seal"] == "valid"
    assert [r["seal"] for r in json.loads(run("runs", "list", "--json").stdout)
            if r["run_id"] == session] == ["valid"]
    manifest = choir_home / "artifacts" / "runs" / session / "manifest.json"
    os.chmod(manifest, 0o644)
    manifest.write_text(manifest.read_text().replace('"status": "FAIL"', '"status": "PASS"'))
    shown = json.loads(run("runs", "show", session, "--json").stdout)
    assert shown["status"] == "PASS" and shown["seal"].startswith("INVALID"), shown["seal"]
    text = run("runs", "show", session).stdout
    assert "seal: INVALID" in text and "not vouched for" in text, text
    # the list says so too (it printed the forged PASS as it printed any other)
    [listed] = [r for r in json.loads(run("runs", "list", "--json").stdout)
                if r["run_id"] == session]
    assert listed["status"] == "PASS" and listed["seal"].startswith("INVALID"), listed
    [line] = [ln for ln in run("runs", "list").stdout.splitlines() if ln.startswith(session)]
    assert "PASS (SEAL INVALID)" in line, line
    elsewhere = tmp_path / "elsewhere.json"  # the same forged record, through a link
    elsewhere.write_bytes(manifest.read_bytes())
    manifest.unlink()
    os.symlink(elsewhere, manifest)
    assert run("runs", "show", session).returncode == 2  # never followed


def test_listing_runs_makes_no_key_and_pins_none(choir_home: Path) -> None:
    """Listing runs reads: it checks seals against the keys pinned, and on a home where none
    is pinned says so (``SEAL UNCHECKED``) rather than pin this home's key on first use,
    which created a signing key (a review found ``runs list`` doing it on an empty home)."""
    assert run("runs", "list").returncode == 0
    assert json.loads(run("runs", "list", "--json").stdout) == []
    assert not (choir_home / "trusted_keys").exists()
    assert not list((choir_home / "keys").glob("ed25519*"))


def test_runs_name_their_repo_and_filter_by_it(tmp_path: Path) -> None:
    # one CHOIR_HOME, two repos: every run said `-` and could not be told apart
    first = calc_repo(tmp_path / "first", canary="c", sandbox="local")
    second = calc_repo(tmp_path / "second", canary="c", sandbox="local")
    one = json.loads(run("verify", "--repo", str(first), "--json").stdout)["run_id"]
    two = json.loads(run("verify", "--repo", str(second), "--json").stdout)["run_id"]
    listed = {r["run_id"]: r["repo"] for r in json.loads(run("runs", "list", "--json").stdout)}
    assert listed == {one: str(first.resolve()), two: str(second.resolve())}
    only = json.loads(run("runs", "list", "--json", "--repo", str(second)).stdout)
    assert [r["run_id"] for r in only] == [two]
    assert str(first.resolve()) in run("runs", "show", one).stdout
    assert str(second.resolve()) in run("runs", "list").stdout
