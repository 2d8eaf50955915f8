"""What the CI entry (``choir-ci github``) costs beyond ``choir verify`` itself.

    python bench/ci_overhead.py [--runs 5] [--sandbox bwrap]

Makes a small git repo (a module, two pytest tests, a ``unit`` verifier with JUnit), then
runs, interleaved, one of each per round, each in a fresh ``CHOIR_HOME``:

- ``verify``: ``choir verify --json --claim ci`` (the bare equivalent: what a workflow step
  would run by hand);
- ``ci``: ``choir-ci github`` with the variables a runner sets: the same verify, then
  ``choir attest bundle``, ``choir gate --vsa``, ``choir keys show``, the summary, the
  annotations and the outputs.

Prints every wall time, the medians and their ratio. Nothing is left behind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

STEP_PY = os.path.realpath(sys.executable)  # the base interpreter a sandboxed step runs
PY = sys.executable


def make_repo(root: Path, sandbox: str) -> Path:
    repo = root / "ws" / "repo"
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n"
                                       "    assert add(2, 3) == 5\n")
    (repo / "choir.yaml").write_text(textwrap.dedent(f"""\
        verifiers:
          unit:
            kind: unit_tests
            steps:
              - name: pytest
                command: {STEP_PY} -m pytest -q -p no:cacheprovider --junitxml=$CHOIR_OUT/junit.xml
            parser: junit
        sandbox: {{backend: {sandbox}}}
        """))
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "b"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    return repo


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[2:4]} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sandbox", default="bwrap")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"verify": [], "ci": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = make_repo(root, args.sandbox)
        for n in range(args.runs + 1):  # round 0 warms caches and is not counted
            for kind in ("verify", "ci"):
                home = root / f"home-{kind}-{n}"
                env = dict(os.environ, CHOIR_HOME=str(home),
                           CHOIR_SEEN_HEADS=str(home / "seen"), PYTHONDONTWRITEBYTECODE="1")
                env.pop("CHOIR_ARTIFACT_DIR", None)
                if kind == "verify":
                    cmd = [PY, "-m", "choir", "verify", "--repo", str(repo), "--json",
                           "--claim", "ci"]
                else:
                    for name in ("output", "summary"):
                        (home.parent / f"{name}-{n}").write_text("")
                    env |= {"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(root / "ws"),
                            "RUNNER_TEMP": str(home / "tmp"), "GITHUB_REPOSITORY": "o/r",
                            "GITHUB_OUTPUT": str(home.parent / f"output-{n}"),
                            "GITHUB_STEP_SUMMARY": str(home.parent / f"summary-{n}"),
                            "CHOIR_CI_REPO": "repo"}
                    cmd = [PY, "-c", "from choir.ci import main; main()", "github"]
                took = timed(cmd, env, root / "ws")
                if n:
                    times[kind].append(took)
                print(f"round {n} {kind:6s} {took:6.2f} s", flush=True)
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(f"median verify {medians['verify']:.2f} s, ci {medians['ci']:.2f} s: "
          f"{medians['ci'] / medians['verify']:.2f}x, "
          f"+{medians['ci'] - medians['verify']:.2f} s; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
