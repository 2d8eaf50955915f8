"""Review 23a, F1: a step that runs as Choir's own user (``--sandbox local``,
``executor_isolation: none``) copied the broker's socket out of the confined ``choir``
process with ``pidfd_getfd`` and read ``CHOIR_HOME`` from its ``/proc/<pid>/environ``, then
had the broker sign a forged PASS. ``confine`` now makes that process non-dumpable at every
level, so both are refused, while its own signatures still work.

The driver runs in its own process (confinement changes a process for good), starts the
"step" as a plain child, as the local sandbox does, and reports what the step got.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

STEP = r'''
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
main, fd = int(sys.argv[1]), int(sys.argv[2])
got = libc.syscall(438, os.pidfd_open(main), fd, 0)  # pidfd_getfd (x86_64 and arm64)
out = {"getfd": "ok" if got >= 0 else errno.errorcode[ctypes.get_errno()]}
try:
    with open(f"/proc/{main}/environ", "rb") as fh:
        out["environ"] = "read" if fh.read() else "empty"
except OSError as err:
    out["environ"] = errno.errorcode[err.errno]
print(json.dumps(out))
'''

# the step's interpreter: one that user 65534 can start (this venv's links into /root)
STEP_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

DRIVER = r'''
import json, os, subprocess, sys, threading, time
from pathlib import Path
home, threaded = Path(sys.argv[1]), sys.argv[2] == "threaded"
if threaded:  # a thread already runs (a library caller): confine stops at `process`
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
from choir.trusted import separate, signer
level = separate(home)
s = signer(home)
step = subprocess.run([sys.argv[4], "-c", sys.argv[3], str(os.getpid()),
                       str(s._sock.fileno())], capture_output=True, text=True)
print(json.dumps({"level": level, "step": json.loads(step.stdout or "{}"),
                  "stderr": step.stderr[-500:],
                  "signs": bool(s.sign(b'{"type":"choir.probe/v1"}'))}))
'''


def _drive(work: Path, mode: str = "plain", as_user: int | None = None) -> dict[str, object]:
    home = work / "home"
    home.mkdir()
    prefix: list[str] = []
    if as_user is not None:
        for path in (work, home):
            os.chown(path, as_user, as_user)
        prefix = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups"]
    proc = subprocess.run([*prefix, sys.executable, "-c", DRIVER, str(home), mode, STEP,
                           STEP_PYTHON],
                          capture_output=True, text=True, timeout=60, cwd="/",
                          env=dict(os.environ, HOME=str(work), CHOIR_HOME=str(home)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def _refused(out: dict[str, object], *, environ: bool = True) -> None:
    step = out["step"]
    assert isinstance(step, dict), out
    assert step.get("getfd") == "EPERM", out  # the broker's socket stays main's
    if environ:
        assert step.get("environ") in {"EACCES", "EPERM"}, out  # nor is CHOIR_HOME given
    assert out["signs"] is True  # main itself still signs through its broker


@pytest.mark.skipif(os.geteuid() != 0, reason="the mount-namespace level needs root")
def test_a_step_of_the_confined_process_cannot_take_its_broker_socket(tmp_path: Path) -> None:
    out = _drive(tmp_path)
    assert out["level"] == "mount-namespace"
    # a root step (every capability but CAP_SYS_PTRACE) still reads main's environ on this
    # kernel (6.18), as it reads the broker's: the home's path, not the masked key
    _refused(out, environ=False)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to become another user")
@pytest.mark.parametrize(("mode", "level"), [("plain", "user-namespace"),
                                             ("threaded", "process")])
def test_as_another_user_at_every_level_the_step_gets_nothing(mode: str, level: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="choir-dumpable-", dir="/tmp"))
    work.chmod(0o755)
    try:
        out = _drive(work, mode, as_user=65534)
    finally:
        shutil.rmtree(work)
    assert out["level"] == level
    _refused(out)
