"""Helpers for the ``choir serve`` tests: a real service per test home, real commands, and a
raw client that can say what ``choir verify`` never would (another uid, a lying directory,
extra fields)."""

from __future__ import annotations

import functools
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

from tests import forked
from tests.workitems import FIXED as CALC_OK
from tests.workitems import STEP_PY as PY
from tests.workitems import UNIT_VERIFIER as UNIT

CHOIR = [sys.executable, "-m", "choir"]
TEST_CALC = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def sleeper(seconds: int) -> str:
    """A ``choir.yaml`` whose one step sleeps until it is stopped (tests find it by its
    command line, so each test module sleeps its own number of seconds)."""
    return textwrap.dedent(f"""\
        verifiers:
          slow:
            kind: lint
            steps:
              - name: sleep
                command: sleep {seconds}
            timeout_s: 120
        """)


SLEEPER = sleeper(97)


# one interpreter start, no pytest: for the tests about the service, not the verifier
QUICK = textwrap.dedent(f"""\
    verifiers:
      unit:
        kind: unit_tests
        steps:
          - name: add
            command: {PY} -c "import calc; assert calc.add(2, 3) == 5"
        timeout_s: 60
    """)


def idle_service(home: Path) -> Any:
    """A ``choir.serve.worker.Service`` for ``home`` with nothing else of a service's: what
    a test hands ``warm_idle`` to ready a worker as the service's fork would."""
    from choir.serve.worker import Service

    return Service(home=home, version="", code="", start_env={}, root=(0, 0), commands={})


def sandbox_name() -> str:
    return "bwrap" if shutil.which("bwrap") else "local"


def make_repo(path: Path, calc: str = CALC_OK, config: str = UNIT) -> Path:
    """A git repo with a tested ``calc.py`` and a ``choir.yaml``."""
    path.mkdir()
    (path / "calc.py").write_text(calc)
    (path / "test_calc.py").write_text(TEST_CALC)
    (path / "choir.yaml").write_text(config)
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)
    return path


def command_item(tmp_path: Path, item_id: str, script: str) -> Path:
    """A work item over ``tmp_path/repo`` whose executor runs the Python ``script`` there."""
    (tmp_path / f"{item_id}.py").write_text(script)
    item = tmp_path / f"{item_id}.yaml"
    item.write_text(f"id: {item_id}\ngoal: {item_id}\nrepo: ./repo\nexecutor:\n"
                    f"  kind: command\n  command: {PY} {tmp_path / f'{item_id}.py'}\n")
    return item


def choir(*args: str, serve: str | None = None, cwd: Path | None = None,
          extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``choir ARGS`` as a user runs it (``CHOIR_SERVE`` as given)."""
    env = dict(os.environ, **(extra_env or {}))
    if serve is not None:
        env["CHOIR_SERVE"] = serve
    return forked.run([*CHOIR, *args], capture_output=True, text=True, cwd=cwd, env=env,
                      timeout=300, check=False)


def start_service(*args: str, extra_env: dict[str, str] | None = None) -> int:
    """``choir serve --detach ARGS`` for this test's home; its pid once it listens."""
    proc = choir("serve", "--detach", *args, extra_env=extra_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"\(pid (\d+)\)", proc.stdout)
    assert found, proc.stdout
    return int(found.group(1))


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            if "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return
        except OSError:
            return
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), f"pid {pid} still runs"


def stop_service(pid: int) -> None:
    """Stop it (``--stop``), and make sure: a test never leaves a service behind."""
    choir("serve", "--stop")
    try:
        wait_gone(pid, timeout=15)
    except AssertionError:
        os.kill(pid, 9)
        wait_gone(pid)


@functools.cache
def client_code() -> str:
    """The code digest ``choir verify`` computes in this environment (a fresh interpreter,
    as the CLI is one: pytest's own ``sys.path`` would differ)."""
    return subprocess.run([sys.executable, "-c",
                           "from choir.serve import stale; print(stale.code())"],
                          capture_output=True, text=True, check=True).stdout.strip()


RAW = textwrap.dedent("""\
    import json, os, socket, struct, sys
    args = json.loads(sys.stdin.read())
    if args["uid"] is not None:
        os.setgid(args["uid"]); os.setuid(args["uid"])
    folder = os.open(os.path.dirname(args["sock"]), os.O_PATH)
    s = socket.socket(socket.AF_UNIX)
    s.connect(f"/proc/self/fd/{folder}/" + os.path.basename(args["sock"]))
    data = json.dumps(args["envelope"]).encode()
    null = os.open(os.devnull, os.O_RDWR)
    fds = [os.open(args["cwd"], os.O_PATH), os.open(args["root"], os.O_PATH),
           os.open("/proc/self/ns/mnt", os.O_RDONLY)] if args["fds"] else []
    frame = struct.pack(">I", len(data)) + data
    try:
        if fds:
            sent = s.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        struct.pack(f"{len(fds)}i", *fds))])
            s.sendall(frame[sent:])
        else:
            s.sendall(frame)
    except OSError:
        pass  # refused before the request was read: the answer is waiting
    while True:
        head = s.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            print("{}"); break
        body = s.recv(struct.unpack(">I", head)[0], socket.MSG_WAITALL)
        message = json.loads(body)
        if "ready" in message:  # taken: the streams follow (/dev/null here)
            s.sendmsg([struct.pack(">I", 2) + b"{}"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                       struct.pack("3i", null, null, null))])
        elif "queued" not in message:
            print(json.dumps(message)); break
    """)


def raw_request(sock: Path, request: dict[str, Any], *, cwd: Path,
                claimed_cwd: str | None = None, root: Path | None = None,
                context: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                as_user: int | None = None, fds: bool = True) -> dict[str, Any]:
    """Send one hand-made request; the service's first answer that is not ``queued``."""
    umask = os.umask(0)
    os.umask(umask)
    envelope = {"context": {"version": _version(), "code": client_code(),
                            "cwd": claimed_cwd or str(cwd), "umask": umask,
                            "environ": {**os.environ, **(env or {})}, **(context or {})},
                "request": request}
    args = {"sock": str(sock), "envelope": envelope, "cwd": str(cwd),
            "root": str(root or "/"), "uid": as_user, "fds": fds}
    proc = subprocess.run([sys.executable, "-c", RAW], input=json.dumps(args),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer


def _version() -> str:
    from choir._version import __version__

    return __version__
