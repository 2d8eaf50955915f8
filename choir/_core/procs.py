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


def drop(proc: subprocess.Popen[bytes]) -> None:
    """End ``proc`` if its answer was never asked for (the caller failed first): killed,
    reaped and its pipes closed, so nothing is left running or open behind the error."""
    if proc.returncode is None:
        proc.kill()
    proc.communicate()
