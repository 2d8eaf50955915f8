"""``choir mcp`` through the SDK's own client: stdio and streamable HTTP, real repos, real
sandboxes, hostile arguments. One stdio session serves most calls (each verify is real)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from choir.mcp.bound import RESPONSE_MAX
from tests import forked
from tests.serving import sleeper, start_service, stop_service
from tests.workitems import JUNIT, NO_PLUGINS

pytestmark = pytest.mark.slow  # CI's slow stage: the README's command stays under five minutes

CHOIR = [sys.executable, "-m", "choir"]
PY = os.path.realpath(sys.executable)
SANDBOX = "bwrap" if shutil.which("bwrap") else "local"
SLOW = sleeper(67)  # a duration no other test sleeps: sleeping() is pgrep over the machine
SLOW_SERVED = sleeper(61)  # its own duration: sleeping() must not see the other test's step
ERROR_MAX = 1200  # an error answer stays short, whatever the argument was

CALC_BUG = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
CALC_OK = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
TESTS = textwrap.dedent("""\
    from calc import add, sub

    def test_add():
        assert add(2, 3) == 5

    def test_sub():
        assert sub(5, 3) == 2
    """)
UNIT = textwrap.dedent(f"""\
    verifiers:
      unit:
        kind: unit_tests
        steps:
          - name: pytest
            command: {NO_PLUGINS} {PY} -m pytest -q -p no:cacheprovider {JUNIT}
        parser: junit
        timeout_s: 120
    """)
# 5 MB on stdout, escape sequences that act on a terminal (clipboard, clear, title), a FAIL
NOISY_PY = ("import sys; sys.stdout.write('\\x1b]52;c;SGVsbG8=\\x07\\x1b[2J\\x1b]0;pwned\\x07"
            "FAILED test_x.py::test_\\x1b[31mred - AssertionError: \\x1b[2J\\n' + "
            "('A' * 1000 + '\\n') * 5000); sys.exit(1)")
NOISY = textwrap.dedent(f"""\
    verifiers:
      noisy:
        kind: unit_tests
        steps:
          - name: flood
            command: {PY} noisy.py
        timeout_s: 120
    """) + "".join(f"  ok{i}:\n    kind: lint\n    steps:\n      - name: t\n        command: "
                   "\"true\"\n" for i in range(10)) + (
    "moods:\n  CALM: {verifiers: [noisy, " + ", ".join(f"ok{i}" for i in range(10)) + "]}\n")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return path


def server(*args: str, cwd: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "choir", "mcp", "--sandbox", SANDBOX, *args],
                                 env=dict(os.environ), cwd=str(cwd))


def text_of(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(session: ClientSession, name: str, args: dict[str, Any]) -> tuple[bool, Any]:
    result = await session.call_tool(name, args)
    text = text_of(result)
    if result.is_error:
        assert len(text) <= ERROR_MAX, text[:300]
        return False, text
    assert len(text.encode()) <= RESPONSE_MAX
    return True, json.loads(text)


def server_pid(marker: str) -> int:
    """The ``choir mcp`` process this test started (a child of this process)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"mcp" in cmd and marker.encode() in cmd:
            return int(entry.name)
    raise AssertionError("the choir mcp process was not found")


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return forked.run([*CHOIR, *args], capture_output=True, text=True, timeout=120,
                      cwd=cwd, env=dict(os.environ))


HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("verify", {"repo": "/"}, "not a repo this server was started for"),
    ("verify", {"repo": "../"}, "not a repo this server was started for"),
    ("verify", {"repo": "escape"}, "not a repo this server was started for"),  # a planted link
    ("verify", {"repo": "x" * 200_000}, "at most 1024 characters"),
    ("verify", {"mood": "CHAOTIC"}, "mood"),
    ("verify", {"network": True}, "network: Extra inputs are not permitted"),
    ("verify", {"allowlist": ["rm"]}, "allowlist: Extra inputs are not permitted"),
    ("verify", {"sandbox": "local"}, "sandbox: Extra inputs are not permitted"),
    ("verify", {"command": "cat ~/.ssh/id_rsa"}, "command: Extra inputs are not permitted"),
    ("verify", {"choir_home": "/tmp/evil"}, "choir_home: Extra inputs are not permitted"),
    ("verify", {"claim": "../../etc"}, "claim"),
    ("show_report", {"id": "../../keys/ed25519.key"}, "id"),
    ("show_attestation", {"id": "0" * 64}, "show_attestation"),
    ("gate", {"work_item": "x", "repo": "/etc"}, "not a repo this server was started for"),
    ("list_runs", {"limit": 10**9}, "limit"),
    ("rm_rf", {}, "unknown tool"),
]


@pytest.mark.skipif(os.geteuid() != 0, reason="the key check reads /proc/PID/root (root)")
async def test_stdio_verify_audit_gate_and_every_hostile_argument(tmp_path: Path,
                                                                   choir_home: Path) -> None:
    repo = make_repo(tmp_path / "calc", {"calc.py": CALC_BUG, "test_calc.py": TESTS,
                                         "choir.yaml": UNIT})
    noisy = make_repo(tmp_path / "noisy", {"noisy.py": NOISY_PY, "choir.yaml": NOISY})
    outside = make_repo(tmp_path / "outside", {"choir.yaml": UNIT})
    (repo / "escape").symlink_to(outside)  # planted in the repo, leads out of it
    (repo / ".git" / "info" / "exclude").write_text("escape\n")
    async with stdio_client(server("--repo", str(repo), "--repo", str(noisy), cwd=repo)) as (
            read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        assert {t.name for t in listed.tools} == {"verify", "show_report", "show_attestation",
                                                  "gate", "list_runs"}
        verify_tool = next(t for t in listed.tools if t.name == "verify")
        assert verify_tool.input_schema.get("additionalProperties") is False

        ok, failed = await call(session, "verify", {"claim": "calc-add"})
        assert ok and failed["status"] == "FAIL" and failed["repo"] == str(repo)
        [unit] = failed["reports"]
        assert unit["result"] == "FAIL" and unit["counts"]["failed"] == 1
        assert any("test_add" in (s.get("test_id") or "") for s in unit["failure_signatures"])
        assert not any("test_sub" in (s.get("test_id") or "") for s in unit["failure_signatures"])
        assert failed["attestations"] == [unit["attestation"]] and "tail_log" not in failed
        assert failed["claim"]["asserted"] is None
        assert failed["sandbox"]["sandbox"] == SANDBOX

        # the key: not readable from inside the server process (only its broker holds it)
        key = choir_home / "keys" / "ed25519.key"
        assert key.is_file()
        pid = server_pid(str(repo))
        assert not Path(f"/proc/{pid}/root{key}").exists(), "the MCP server can read the key"

        att = failed["attestations"][0]
        ok, shown = await call(session, "show_attestation", {"id": att})
        assert ok and shown["valid"] and shown["result"] == "FAIL" and shown["verifier"] == "unit"
        ok, report = await call(session, "show_report", {"id": att})
        assert ok and report["report_intact"] and report["report"]["result"] == "FAIL"
        ok, gate = await call(session, "gate", {"work_item": "calc-add"})
        assert ok and gate["passed"] is False and gate["problems"]

        # what the person's own commands say about the same evidence
        audit = cli("audit", "--json")
        assert audit.returncode == 0, audit.stdout[-2000:]
        assert json.loads(audit.stdout)["counts"]["attestations"] >= 1
        assert att in cli("attest", "show", att).stdout
        assert cli("gate", "calc-add", "--repo", str(repo)).returncode == 1

        for name, args, expect in HOSTILE:
            ok, text = await call(session, name, args)
            assert not ok and expect in text, (name, list(args), text[:300])

        (repo / "calc.py").write_text(CALC_OK)
        ok, passed = await call(session, "verify", {"claim": "calc-add", "mood": "CALM"})
        assert ok and passed["status"] == "PASS" and passed["claim"]["asserted"]
        ok, gate = await call(session, "gate", {"work_item": "calc-add"})
        assert ok and gate["passed"] is True, gate
        assert cli("gate", "calc-add", "--repo", str(repo)).returncode == 0

        # 5 MB of output and escape sequences: a bounded, cleaned answer
        ok, flood = await call(session, "verify", {"repo": str(noisy)})
        assert ok and flood["status"] == "FAIL" and len(flood["attestations"]) == 11
        # at most what choir run's executor hears, what failed first
        assert len(flood["reports"]) == 8 and flood["reports_truncated"] == 3
        assert flood["reports"][0]["verifier"] == "noisy"
        blob = json.dumps(flood, ensure_ascii=False)
        assert "\x1b" not in blob and "\x07" not in blob and "A" * 1000 not in blob
        assert len(blob.encode()) <= RESPONSE_MAX

        ok, runs = await call(session, "list_runs", {"repo": str(repo), "limit": 5})
        assert ok and [r["run_id"] for r in runs["runs"]] == [passed["run_id"], failed["run_id"]]
        ok, runs = await call(session, "list_runs", {"limit": 1})
        assert ok and len(runs["runs"]) == 1 and runs["stored"] >= 3

        # an edit to choir.yaml (the allowlist) after the start is not the person's policy
        (repo / "choir.yaml").write_text(UNIT.replace("timeout_s: 120", "timeout_s: 121"))
        ok, text = await call(session, "verify", {})
        assert not ok and "changed since `choir mcp` started" in text


def sleeping(seconds: int = 67) -> str:
    """The pids of this module's sleeping steps of ``seconds`` (each test sleeps its own
    number: xdist runs them side by side)."""
    return subprocess.run(["pgrep", "-f", f"sleep {seconds}"], capture_output=True,
                          text=True).stdout


async def test_a_long_verification_is_stopped_at_its_bound_and_other_calls_still_answer(
        tmp_path: Path) -> None:
    slow = make_repo(tmp_path / "slow", {"choir.yaml": SLOW})
    async with stdio_client(server("--repo", str(slow), "--timeout", "4", cwd=slow)) as (
            read, write), ClientSession(read, write) as session:
        await session.initialize()
        done: dict[str, Any] = {}
        start = time.monotonic()

        async def verify() -> None:
            done["verify_ok"], done["answer"] = await call(session, "verify", {})
            done["verify"] = time.monotonic() - start

        async def runs() -> None:
            await anyio.sleep(1.0)
            ok, _ = await call(session, "list_runs", {})
            done["runs"] = time.monotonic() - start
            assert ok

        async with anyio.create_task_group() as tg:
            tg.start_soon(verify)
            tg.start_soon(runs)
        # list_runs answered while the verification still ran; that one ended at its bound
        assert done["runs"] + 0.5 < done["verify"] and 4 <= done["verify"] < 30, done
        answer = done["answer"]
        assert done["verify_ok"] and answer["status"] == "FAIL", answer
        assert "not done within 4 s" in answer["stopped"] and answer["attestations"]
        assert "killed by signal 9" in answer["reports"][0]["summary"]  # killed, and says so
        assert not sleeping(), "the stopped verification left its step running"

        # the client gives up (notifications/cancelled): the same stop, the session recorded
        with pytest.raises(Exception, match="(?i)timed out|timeout"):
            await session.call_tool("verify", {}, read_timeout_seconds=2)
        for _ in range(100):
            ok, runs = await call(session, "list_runs", {})
            if len([r for r in runs["runs"] if r["kind"] == "verify"]) == 2:
                break
            await anyio.sleep(0.2)
        else:
            raise AssertionError(f"the cancelled verification was not recorded: {runs}")
        assert not sleeping(), "a verification the client cancelled ran on"
    audit = cli("audit", "--json")  # every run the stopped steps sealed is attested
    assert audit.returncode == 0, audit.stdout[-2000:]


async def test_through_a_running_service_the_answer_and_the_stop_are_the_same(
        tmp_path: Path) -> None:
    """With `choir serve` running, the tools verify through it (CHOIR_SERVE=require fails
    the call otherwise): the same answer, and past the bound the worker's sandboxes are
    stopped on request, the cut run attested."""
    pid = start_service()
    try:
        repo = make_repo(tmp_path / "calc", {"calc.py": CALC_BUG, "test_calc.py": TESTS,
                                             "choir.yaml": UNIT})
        params = server("--repo", str(repo), cwd=repo)
        params.env = {**(params.env or {}), "CHOIR_SERVE": "require"}
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            ok, answer = await call(session, "verify", {})
            assert ok and answer["status"] == "FAIL", answer
            assert answer["failing_tests"][0]["node_id"] == "test_calc.py::test_add"
        slow = make_repo(tmp_path / "slow", {"choir.yaml": SLOW_SERVED})
        params = server("--repo", str(slow), "--timeout", "4", cwd=slow)
        params.env = {**(params.env or {}), "CHOIR_SERVE": "require"}
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            done: dict[str, Any] = {}

            async def verify() -> None:
                done["ok"], done["answer"] = await call(session, "verify", {})

            async with anyio.create_task_group() as tg:
                tg.start_soon(verify)
                while "answer" not in done and "under" not in done:
                    if any(pid in _ancestors(int(step)) for step in sleeping(61).split()):
                        done["under"] = True  # the step runs under the service's worker
                    await anyio.sleep(0.1)
            assert done.get("under"), "the verification did not run in the service"
            answer = done["answer"]
            assert done["ok"] and "not done within 4 s" in answer["stopped"], answer
            assert "killed by signal 9" in answer["reports"][0]["summary"] and \
                answer["attestations"]
        assert not sleeping(61), "the service's worker left the step running"
        audit = cli("audit", "--json")
        assert audit.returncode == 0, audit.stdout[-2000:]
    finally:
        stop_service(pid)


def _ancestors(pid: int) -> set[int]:
    found: set[int] = set()
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        found.add(pid)
    return found


async def test_http_refuses_without_the_token_and_serves_with_it(tmp_path: Path) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    repo = make_repo(tmp_path / "calc", {"calc.py": CALC_OK, "test_calc.py": TESTS,
                                         "choir.yaml": UNIT})
    proc = subprocess.Popen([*CHOIR, "mcp", "--transport", "http", "--repo", str(repo),
                             "--sandbox", SANDBOX],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]
        token = re.search(r"token (\S+)", proc.stdout.readline()).group(1)  # type: ignore[union-attr]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/mcp", url)
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}
        accept = {"accept": "application/json, text/event-stream"}
        for headers, status in (({}, 401), ({"authorization": "Bearer " + "x" * 43}, 401),
                                ({"authorization": token}, 401),
                                ({"authorization": f"Bearer {token}", "host": "evil.test"}, 403)):
            got = httpx.post(url, json=hello, headers={**accept, **headers}, timeout=10)
            assert got.status_code == status, (headers.keys(), got.status_code, got.text)
        client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        async with client, streamable_http_client(url, http_client=client) as (
                read, write, *_), ClientSession(read, write) as session:
            await session.initialize()
            assert len((await session.list_tools()).tools) == 5
            ok, gate = await call(session, "gate", {"work_item": "calc-add"})
            assert ok and gate["passed"] is False
            ok, found = await call(session, "verify", {"claim": "calc-add"})
            assert ok and found["status"] == "PASS" and found["claim"]["asserted"]
            ok, gate = await call(session, "gate", {"work_item": "calc-add"})
            assert ok and gate["passed"] is True
            ok, text = await call(session, "gate", {"work_item": "x", "repo": str(tmp_path)})
            assert not ok and "not a repo this server was started for" in text
            ok, text = await call(session, "verify", {"network": "on"})
            assert not ok and "Extra inputs are not permitted" in text
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


async def test_a_heldout_check_reaches_the_agent_as_counts_only(tmp_path: Path,
                                                                choir_home: Path) -> None:
    from tests.heldoutrepo import MARKER, write_heldout

    repo = make_repo(tmp_path / "calc", {"calc.py": CALC_BUG, "test_calc.py": TESTS,
                                         "choir.yaml": UNIT})
    write_heldout(choir_home, repo)
    async with stdio_client(server("--repo", str(repo), cwd=repo)) as (
            read, write), ClientSession(read, write) as session:
        await session.initialize()
        ok, found = await call(session, "verify", {"mood": "PARANOID"})
        assert ok and found["status"] == "FAIL", found
        hidden = [r for r in found["reports"] if r["verifier"] == "hidden"]
        assert hidden and hidden[0]["result"] == "FAIL"
        assert set(hidden[0]["counts"].values()) <= {None}  # the step's to declare
        ok, report = await call(session, "show_report", {"id": hidden[0]["attestation"]})
        assert ok
        for answer in (found, report):
            blob = json.dumps(answer)
            assert MARKER not in blob and "test_hidden" not in blob, blob[:2000]
        assert any("test_add" in t["node_id"] for t in found["failing_tests"])
    # the person's own view keeps the full report
    att = json.loads(cli("attest", "show", hidden[0]["attestation"]).stdout)
    assert att["body"]["heldout"]
