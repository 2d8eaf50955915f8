"""``choir run`` with an LLM executor: cold, and through ``choir serve`` request by request.

    python bench/warm_model_run.py [--runs 6]

A work item whose executor is ``kind: llm`` against a fake OpenAI-compatible server on
127.0.0.1 (``choir.testing.FakeModelServer``: one reply, "nothing to change"), a one-step
verifier, ``max_attempts: 1``. Prints the wall time of each cold run (``CHOIR_SERVE=off``)
and of each request to a service started for the bench, in order: the first request's
worker imports litellm (seconds), the service then imports it once for the workers it forks
next (``choir.serve.server._warm_models``), so the requests after it do not. Nothing is
left behind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from choir.testing import FakeModelServer, final_output

CONFIG = """verifiers:
  unit:
    kind: unit_tests
    steps:
      - name: add
        command: {python} -c "import calc; assert calc.add(2, 3) == 5"
    timeout_s: 60
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="choir-model-run-") as tmp:
        root = Path(tmp)
        repo = root / "repo"
        repo.mkdir()
        (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        (repo / "choir.yaml").write_text(CONFIG.format(python=os.path.realpath(sys.executable)))
        for args in (["init", "-q"], ["add", "-A"],
                     ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "base"]):
            subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
        home = root / "home"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(CHOIR_HOME=str(home), CHOIR_ARTIFACT_DIR=str(home / "artifacts"))
        choir = [sys.executable, "-m", "choir"]
        with FakeModelServer([final_output(summary="nothing to change")],
                             repeat_last=True) as server:
            item = root / "item.yaml"
            item.write_text(f"id: keep-add\ngoal: keep add\nrepo: ./repo\nmax_attempts: 1\n"
                            f"executor:\n  kind: llm\n  model: {server.model}\n")
            model = {"OPENAI_API_BASE": server.api_base, "OPENAI_API_KEY": "sk-fake"}

            def timed(run_id: str, serve: str) -> float:
                start = time.perf_counter()
                proc = subprocess.run([*choir, "run", str(item), "--run-id", run_id, "--json"],
                                      env={**env, **model, "CHOIR_SERVE": serve}, cwd=root,
                                      capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise SystemExit(f"choir run exited {proc.returncode}: "
                                     f"{proc.stderr[-2000:]}")
                return time.perf_counter() - start

            cold = [timed(f"cold-{i}", "off") for i in range(runs)]
            subprocess.run([*choir, "serve", "--detach"], env=env, cwd=root, check=True,
                           capture_output=True)
            try:
                warm = []
                for i in range(runs):
                    warm.append(timed(f"warm-{i}", "require"))
                    time.sleep(1.0)  # the worker's work after its answer, the next one's fork
            finally:
                subprocess.run([*choir, "serve", "--stop"], env=env, cwd=root,
                               capture_output=True, check=False)
    print(f"`choir run`, LLM executor (a fake server), {runs} runs each")
    print("cold:         " + " ".join(f"{s:5.2f}" for s in cold)
          + f"   median {statistics.median(cold):.2f} s")
    print("choir serve:  " + " ".join(f"{s:5.2f}" for s in warm)
          + f"   median of the last {runs - 2}: {statistics.median(warm[2:]):.2f} s")


if __name__ == "__main__":
    main()
