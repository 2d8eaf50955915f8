"""A started process's answer, waited for with a bound."""

from __future__ import annotations

import subprocess


def output(proc: subprocess.Popen[bytes], timeout: float) -> bytes | None:
    """What ``proc`` wrote to its stdout, once it exited 0; None when it failed, or was
    still running after ``timeout`` seconds (it is then killed and reaped)."""
    try:
        out, _err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    return out if proc.returncode == 0 else None
