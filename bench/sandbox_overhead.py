"""Per-run overhead of each sandbox against a bare subprocess of the same command.

    python bench/sandbox_overhead.py [--runs 30] [--gap-ms 0]

Median wall time from Python, end to end (``Sandbox.exec`` returns), of each command under:

- ``bare``: ``subprocess.run(["/bin/sh", "-c", CMD])``;
- ``local``: the unsafe backend (same process tree, Choir's environment);
- ``bwrap-ns``: bwrap's namespaces only, no cgroup limits (what a non-root user gets);
- ``bwrap``: the default policy (``Limits()``: pids and memory cgroups on), as verifiers run;
- ``bwrap-run``: as ``bwrap``, but the base interpreter bound by a ``mount`` on each run's
  path rather than when the launcher is armed (the cost before that change);
- ``docker``: a fresh container per run, when an engine answers.

Samples are interleaved (one of each configuration per round), so the machine's drift hits
every row alike; compare differences within one run, not across runs. ``python3`` on PATH may
be a wrapper (pyenv shims are bash scripts), so the real interpreter is measured too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from choir.models import Limits
from choir.sandbox import Sandbox, get_sandbox
from choir.sandbox.base import run_process


def sandbox_run(sb: Sandbox, command: str, repo: Path, out: Path) -> Callable[[], None]:
    def once() -> None:
        result = sb.exec(command, repo=repo, out_dir=out, env={}, timeout_s=60,
                         limits=Limits(), network=False, sink=lambda _: None)
        assert result.exit_code == 0 and result.infra_error is None, result

    return once


def bare_run(command: str) -> None:
    subprocess.run(["/bin/sh", "-c", command], check=True, stdin=subprocess.DEVNULL)


def namespaces_only(command: str, repo: Path, out: Path) -> Callable[[], None]:
    from choir.sandbox.bwrap import BwrapSandbox

    argv = BwrapSandbox().argv(command, repo=repo.resolve(), out_dir=out.resolve(), env={},
                               network=False)

    def once() -> None:
        result = run_process(argv, env={"PATH": "/usr/bin:/bin"}, cwd=None, timeout_s=60,
                             sink=lambda _: None)
        assert result.exit_code == 0, result

    return once


def unstaged(run: Callable[[], None]) -> Callable[[], None]:
    """``run`` as before the interpreter was staged when the launcher is armed: it is bound
    by a ``mount`` on each run's path instead (the launcher's own binding goes unused)."""
    from choir.sandbox import bwrap

    def once() -> None:
        saved = bwrap.prestaged_python
        bwrap.prestaged_python = lambda: None  # type: ignore[assignment]
        try:
            run()
        finally:
            bwrap.prestaged_python = saved  # type: ignore[assignment]

    return once


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="idle time between rounds (verifier steps are rarely back-to-back)")
    parser.add_argument("--no-docker", action="store_true", help="skip the docker rows")
    parser.add_argument("--no-bwrap-run", action="store_true",
                        help="skip the bwrap-run row (the interpreter mounted per run)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    repo, out = tmp / "repo", tmp / "out"
    repo.mkdir()
    (out / "tmp").mkdir(parents=True)
    from choir.sandbox.docker import DockerSandbox

    sandboxes = {"local": get_sandbox("local"), "bwrap": get_sandbox("bwrap")}
    if not args.no_docker and DockerSandbox.available():
        sandboxes["docker"] = get_sandbox("docker")
    real = os.path.realpath(sys.executable)
    commands = ["true", "python3 -c pass", f"{real} -c pass"]
    print(f"{'command':22} {'backend':9} {'median ms':>10} {'overhead ms':>12} {'vs bare':>8}")
    for command in commands:
        configs: dict[str, Callable[[], None]] = {
            "bare": lambda c=command: bare_run(c),
            "local": sandbox_run(sandboxes["local"], command, repo, out),
            "bwrap-ns": namespaces_only(command, repo, out),
        }
        for name in ("bwrap", "docker"):
            if name in sandboxes:
                configs[name] = sandbox_run(sandboxes[name], command, repo, out)
        if "bwrap" in sandboxes and not args.no_bwrap_run:
            configs["bwrap-run"] = unstaged(configs["bwrap"])
        samples: dict[str, list[float]] = {name: [] for name in configs}
        for fn in configs.values():
            fn()  # warm-up
        for _ in range(args.runs):
            for name, fn in configs.items():
                if args.gap_ms:
                    time.sleep(args.gap_ms / 1000)
                start = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - start) * 1000)
        bare = statistics.median(samples["bare"])
        label = command if command != commands[-1] else "real python3 -c pass"
        for name, values in samples.items():
            ms = statistics.median(values)
            print(f"{label:22} {name:9} {ms:10.1f} {ms - bare:12.1f} {ms / bare:8.2f}x")
    for sb in sandboxes.values():
        sb.close()


if __name__ == "__main__":
    main()
