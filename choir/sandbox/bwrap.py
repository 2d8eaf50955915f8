"""``bwrap``: Linux namespaces via bubblewrap, for machines without a Docker engine.

Two holes measured on these machines are closed (PLATFORM.md): the process never keeps
capabilities (``--unshare-all --cap-drop ALL --uid 65534``), so it cannot remount the repo
read-write; and ``/``, ``/run`` and ``/var/run`` are never bound, so the Docker socket is not
reachable. Only the toolchain (``/usr``, ``/etc``, the Python installation and active venv)
is bound, read-only, at the same paths, so ``python3 -m pytest`` works unchanged.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from choir.models import Limits
from choir.sandbox._cgroups import CgroupLimits
from choir.sandbox.base import (
    ExecResult,
    Sandbox,
    Sink,
    prepare_out,
    register_sandbox,
    run_process,
    step_env,
    stream_process,
)

_FORBIDDEN = ("/run", "/var/run", "/proc", "/sys", "/dev")


def _toolchain_paths() -> list[str]:
    """Read-only binds for the user's toolchain, outside /usr, deepest-first de-duplicated."""
    candidates = {sys.base_prefix, sys.prefix, os.environ.get("VIRTUAL_ENV", "")}
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if entry and os.path.isdir(entry):
            candidates.add(os.path.dirname(entry) if entry.endswith("/bin") else entry)
    paths = sorted(
        os.path.realpath(p) for p in candidates
        if p and os.path.isdir(p) and p != "/"
        and not p.startswith(("/usr", "/etc")) and not p.startswith(_FORBIDDEN)
        and os.path.realpath(p) != "/"
    )
    kept: list[str] = []
    for path in paths:
        if not any(path == k or path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


@register_sandbox("bwrap")
class BwrapSandbox(Sandbox):
    isolation = "namespace"

    def __init__(self) -> None:
        self._bwrap = shutil.which("bwrap") or "bwrap"

    _usable: ClassVar[bool | None] = None

    @classmethod
    def available(cls) -> bool:
        """True when a real run works here: the probe is the very argv a verifier gets."""
        if cls._usable is None:
            if not shutil.which("bwrap"):
                cls._usable = False
            else:
                import tempfile

                from choir.models import Limits as _Limits

                with tempfile.TemporaryDirectory(prefix="choir-bwrap-probe-") as tmp:
                    result = cls().exec("true", repo=Path(tmp), out_dir=Path(tmp) / "out",
                                        env={}, timeout_s=10, limits=_Limits(),
                                        network=False, sink=lambda _: None)
                cls._usable = result.exit_code == 0 and result.infra_error is None
        return cls._usable

    def argv(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
             network: bool, repo_writable: bool = False, readable: Sequence[Path] = (),
             hidden: Sequence[Path] = ()) -> list[str]:
        """The bwrap command line. ``readable``/``hidden`` serve executors (choir.executors):
        extra read-only binds, then paths masked (an empty tmpfs, or /dev/null for a file)."""
        args = [self._bwrap, "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib64", "sbin"):
            path = Path("/") / name
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        args += ["--ro-bind", "/etc", "/etc", "--dev", "/dev", "--proc", "/proc",
                 "--tmpfs", "/tmp"]  # before any bind under /tmp, or it would hide them
        for tool in _toolchain_paths():
            args += ["--ro-bind", tool, tool]
        for path in readable:
            args += ["--ro-bind", str(path), str(path)]
        args += ["--bind" if repo_writable else "--ro-bind", str(repo), str(repo),
                 "--bind", str(out_dir), str(out_dir)]
        for path in hidden:
            args += ["--tmpfs", str(path)] if path.is_dir() else \
                ["--ro-bind", "/dev/null", str(path)]
        args += ["--unshare-all", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL",
                 "--die-with-parent", "--new-session", "--clearenv"]
        if network:
            args.append("--share-net")
        for key, value in step_env(str(out_dir), env).items():
            args += ["--setenv", key, value]
        args += ["--chdir", str(repo), "/bin/sh", "-c", command]
        return args

    def exec(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
             timeout_s: float, limits: Limits, network: bool, sink: Sink,
             repo_writable: bool = False, readable: Sequence[Path] = (),
             hidden: Sequence[Path] = ()) -> ExecResult:
        prepare_out(out_dir)
        argv = self.argv(command, repo=repo.resolve(), out_dir=out_dir.resolve(), env=env,
                         network=network, repo_writable=repo_writable, readable=readable,
                         hidden=hidden)
        cgroup = CgroupLimits(limits)
        try:
            if not cgroup.applied:
                return run_process(argv, env={"PATH": "/usr/bin:/bin"}, cwd=None,
                                   timeout_s=timeout_s, sink=sink)
            start = time.monotonic()
            try:
                proc = cgroup.spawn(argv)
            except OSError as exc:
                return ExecResult(-1, int((time.monotonic() - start) * 1000),
                                  infra_error=f"bwrap could not start inside its limits: {exc}")
            result = stream_process(proc, start=start, timeout_s=timeout_s, sink=sink)
            if result.exit_code != 0 and cgroup.oom_killed():
                result = replace(result, oom_killed=True)
            return result
        finally:
            cgroup.close()
