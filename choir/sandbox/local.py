"""``local``: a plain subprocess. Explicitly unsafe: attestations record isolation ``none``."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from choir.models import AppliedLimits, Limits
from choir.sandbox.base import (
    ExecResult,
    OutWatch,
    Sandbox,
    Sink,
    prepare_out,
    register_sandbox,
    run_process,
    step_env,
)


@register_sandbox("local")
class LocalSandbox(Sandbox):
    isolation = "none"
    auto_rank = 100

    def __init__(self, **_options: object) -> None:
        """Options (image, python, binds) are the isolating backends'; unsafe runs the host's."""

    def limits_enforceable(self) -> bool:
        """Never: a plain subprocess has no memory or pids limit (only the out cap)."""
        return False

    def exec(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
             timeout_s: float, limits: Limits, network: bool, sink: Sink,
             repo_writable: bool = False) -> ExecResult:
        prepare_out(out_dir)
        watch = OutWatch(out_dir, limits.out_mb)
        result = run_process(["/bin/sh", "-c", f"ulimit -f {watch.fsize_blocks} && exec /bin/sh "
                              f"-c {shlex.quote(command)}"], env=step_env(str(out_dir), env),
                             cwd=str(repo), timeout_s=timeout_s, sink=sink, watch=watch)
        if result.infra_error:
            return result
        return replace(result, limits_applied=AppliedLimits(out_mb=limits.out_mb))
