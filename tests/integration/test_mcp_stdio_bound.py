"""``choir mcp`` over stdio reads a request line up to a bound, then answers an error (review
11, F5).

The SDK's stdio transport read a whole line before parsing, with no limit: a client that sent
656 MiB with no newline grew the server to 737 MiB RSS, on the way to the OOM killer. A real
``choir mcp`` process is driven here over its pipes and through the SDK's own client.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import IO, Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp.shared.exceptions import MCPError

from choir.mcp.stdio import LINE_MAX

CONFIG = textwrap.dedent("""\
    verifiers:
      ok:
        kind: lint
        steps:
          - name: t
            command: "true"
    """)
FLOOD = 48 << 20  # twelve times the bound, never a newline
LIMIT = DEFAULT_MAX_REQUEST_BODY_SIZE
assert LIMIT == LINE_MAX  # the stdio bound is the HTTP one


def _repo(path: Path) -> Path:
    path.mkdir()
    (path / "choir.yaml").write_text(CONFIG)
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)
    return path


def _rss_mib(pid: int) -> int:
    """The largest RSS among ``pid`` and its children (the broker is a child)."""
    pids = [pid] + [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], text=True,
                                                   capture_output=True).stdout.split()]
    best = 0
    for each in pids:
        try:
            for line in Path(f"/proc/{each}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    best = max(best, int(line.split()[1]) // 1024)
        except OSError:
            continue
    return best


def _ask(stdin: IO[bytes], stdout: IO[bytes], message: dict[str, Any]) -> dict[str, Any]:
    stdin.write(json.dumps(message).encode() + b"\n")
    stdin.flush()
    return dict(json.loads(stdout.readline()))


def _initialize(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    hello = _ask(stdin, stdout, {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}})
    assert hello["id"] == 1 and "result" in hello
    stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')


def test_an_endless_line_is_read_within_the_bound_then_answered(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    proc = subprocess.Popen([sys.executable, "-m", "choir", "mcp", "--repo", str(repo),
                             "--sandbox", "local"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=repo)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        _initialize(proc.stdin, proc.stdout)
        start = _rss_mib(proc.pid)
        head = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"gate",' \
               b'"arguments":{"work_item":"'
        proc.stdin.write(head)
        chunk = b"A" * (1 << 20)
        for _ in range(FLOOD >> 20):
            proc.stdin.write(chunk)  # blocks until the server has read the pipe
        proc.stdin.flush()
        time.sleep(0.5)
        grown = _rss_mib(proc.pid) - start
        assert grown < 3 * (LIMIT >> 20), f"the server grew {grown} MiB reading one line"
        proc.stdin.write(b'"}}}\n')
        proc.stdin.flush()
        refused = json.loads(proc.stdout.readline())
        assert refused["id"] == 7 and refused["error"]["code"] == -32700, refused
        assert f"over {LIMIT} bytes" in refused["error"]["message"]
        # discarded up to its newline: the next request is read as it should be
        listed = _ask(proc.stdin, proc.stdout, {"jsonrpc": "2.0", "id": 8,
                                                "method": "tools/list"})
        assert listed["id"] == 8 and any(t["name"] == "gate" for t in listed["result"]["tools"])
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdin.close()
        proc.stdout.close()


def test_the_sdk_client_gets_an_error_for_a_huge_argument(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "choir", "mcp", "--repo", str(repo), "--sandbox", "local"],
        env=dict(os.environ), cwd=str(repo))

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with anyio.fail_after(60), pytest.raises(MCPError, match=f"over {LIMIT} bytes"):
                await session.call_tool("gate", {"work_item": "x" * (LIMIT + 10)})
            with anyio.fail_after(60):
                answer = await session.call_tool("list_runs", {"limit": 1})
            assert not answer.is_error

    anyio.run(main)


@pytest.mark.parametrize("shape", ["nested", "long number", "no message"])
def test_a_line_the_sdk_cannot_parse_is_answered_not_dropped(tmp_path: Path, shape: str) -> None:
    """Review 16f: a value nested 100,000 deep, or a number of a million digits, within the
    line bound: the SDK's reader handed its parse failure on and no one answered, so a
    client waited forever. Such a line gets a parse error, and the next is read."""
    repo = _repo(tmp_path / "repo")
    proc = subprocess.Popen([sys.executable, "-m", "choir", "mcp", "--repo", str(repo),
                             "--sandbox", "local"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=repo)
    assert proc.stdin is not None and proc.stdout is not None
    bad = {"nested": b'{"jsonrpc":"2.0","id":5,"method":"ping","params":{"a":' +
                     b"[" * 100_000 + b"]" * 100_000 + b"}}",
           "long number": b'{"jsonrpc":"2.0","id":5,"method":"ping","params":{"a":' +
                          b"9" * 1_000_000 + b"}}",
           "no message": b'{"id":5,"hello":1}'}[shape]
    try:
        _initialize(proc.stdin, proc.stdout)
        proc.stdin.write(bad + b"\n")
        proc.stdin.flush()
        import select  # an answer, or a failure: the old server never answered at all

        assert select.select([proc.stdout], [], [], 60)[0], "no answer to the line"
        refused = json.loads(proc.stdout.readline())
        assert refused["id"] == 5 and refused["error"]["code"] == -32700, refused
        listed = _ask(proc.stdin, proc.stdout, {"jsonrpc": "2.0", "id": 8,
                                                "method": "tools/list"})
        assert listed["id"] == 8
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdin.close()
        proc.stdout.close()
