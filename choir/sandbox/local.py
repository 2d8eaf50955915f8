"""``local``: a plain subprocess. Explicitly unsafe: attestations record isolation ``none``.

Unsafe, but it runs the project's interpreter like every backend (``sandbox.python``, an
active non-Choir venv, the repo's ``.venv``, else the base Python), never Choir's own: with
Choir's venv first on PATH, ``python3 -m pytest`` ran Choir's interpreter and its pytest
plugins, which broke a project with ``filterwarnings = error``.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from choir.models import AppliedLimits, Limits
from choir.sandbox import _toolchain
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

    def __init__(self, python: str | None = None, **_options: object) -> None:
        """``python``: the project's interpreter (``sandbox.python``); image and binds are the
        isolating backends' options."""
        self._python = python

    def toolchain(self, repo: Path) -> _toolchain.Toolchain:
        return _toolchain.choose(repo, self._python)

    def limits_enforceable(self) -> bool:
        """Never: a plain subprocess has no memory or pids limit (only the out cap)."""
        return False

    def exec(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
             timeout_s: float, limits: Limits, network: bool, sink: Sink,
             repo_writable: bool = False, hosts: Sequence[str] = ()) -> ExecResult:
        if hosts:  # no isolation: the host's network as it is (isolation ``none`` recorded)
            sink(b"[choir] egress: the local sandbox enforces no host list (isolation none)\n")
        prepare_out(out_dir)
        watch = OutWatch.of(out_dir, limits)
        result = run_process(["/bin/sh", "-c", f"ulimit -f {watch.fsize_blocks} && exec /bin/sh "
                              f"-c {shlex.quote(command)}"], env=self._env(repo, out_dir, env),
                             cwd=str(repo), timeout_s=timeout_s, sink=sink, watch=watch)
        if result.infra_error:
            return result
        return replace(result, limits_applied=AppliedLimits(out_mb=limits.out_mb))

    def _env(self, repo: Path, out_dir: Path, env: Mapping[str, str]) -> dict[str, str]:
        """``step_env`` with the project's interpreter first on PATH and Choir's own venv
        taken off it."""
        tools = _toolchain.choose(repo, self._python)
        variables = step_env(str(out_dir), env)
        if "PATH" in env:
            return variables
        own = os.path.realpath(os.path.join(sys.prefix, "bin"))
        rest = [p for p in variables["PATH"].split(":")
                if p and os.path.realpath(p) != own and p not in tools.path_head]
        variables["PATH"] = ":".join((*tools.path_head, *rest))
        if tools.venv:
            variables["VIRTUAL_ENV"] = tools.venv
        elif os.path.realpath(variables.get("VIRTUAL_ENV", "/")) == os.path.realpath(sys.prefix):
            variables.pop("VIRTUAL_ENV")
        return variables
