"""A real local model's cost: SmolLM2-135M (the ``realmodel`` profile) as reporter, Director
and ``llm`` executor, against ``choir verify`` without a model.

    python bench/real_model.py [--runs 3] [--sandbox bwrap] [--no-executor]

- ``start``: ``LocalModelServer`` started and stopped ``--runs`` times (the model's load
  included); median seconds to the first answer.
- ``verify``, interleaved per round, on a failing repo (one pytest verifier, one
  ``security_scan`` running ``true``): ``bare`` (no model), ``model`` (``models.reporter``
  and ``models.director`` on the server, the schema in the server's form), ``json_object``
  (the same, ``CHOIR_MODEL_SCHEMA=json_object``: what litellm's ``auto`` sends for a model
  it does not know, as before this profile). Wall seconds, then how long the server stayed
  busy after the run ended (replies nobody waits for still run to their bound), which the
  next run would have queued behind: the bench waits for an idle server between runs.
- ``calls``: every model call of those runs through a loopback recorder: per role and form,
  median seconds at the server, prompt and completion tokens, how many replies validated.
- ``executor``: one ``choir run`` of the llm executor (1 attempt of at most 120 s, 4 turns of
  at most ``--turn-tokens``): wall seconds, status, calls, tokens, then how long the server
  stayed busy after it.

Nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from choir.director.advisor import _Reply as DirectorReply  # noqa: E402
from choir.llm import parse_reply  # noqa: E402
from choir.report.reporter import _Reply as ReporterReply  # noqa: E402
from choir.testing.local_model import LocalModelServer  # noqa: E402
from tests.realmodel import Exchange, Recorder  # noqa: E402
from tests.workitems import calc_repo  # noqa: E402

SCAN = """\
    scan:
      kind: security_scan
      steps: [{name: scan, command: "true"}]
    """
SCHEMAS = {"reporter": ReporterReply, "director": DirectorReply}


def choir(*args: str, env: dict[str, str]) -> tuple[float, int, str]:
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "choir", *args], capture_output=True,
                          text=True, env=env, timeout=1800)
    return time.monotonic() - began, proc.returncode, proc.stdout


def valid(call: Exchange) -> bool:
    schema = SCHEMAS.get(call.role())
    if schema is None or call.status != 200:
        return False
    try:
        schema.model_validate(parse_reply(call.content))
        return True
    except ValueError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--no-executor", action="store_true")
    parser.add_argument("--turn-tokens", type=int, default=256,
                        help="the llm executor's executor.max_tokens")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="choir-bench-model-"))
    home = work / "home"
    try:
        starts = []
        for _ in range(args.runs):
            with LocalModelServer() as probe:
                starts.append(probe.started_s)
        print(f"start: median {statistics.median(starts):.2f} s "
              f"({', '.join(f'{s:.2f}' for s in starts)})")
        with LocalModelServer() as server, \
                Recorder(upstream=f"http://127.0.0.1:{server.port}") as wire:
            model = server.model
            calc_repo(work / "bare", canary="bench", sandbox=args.sandbox, verifiers=SCAN)
            calc_repo(work / "model", canary="bench", sandbox=args.sandbox, verifiers=SCAN,
                      extra=f"models: {{reporter: {model}, director: {model}}}\n")
            base = {**os.environ, "CHOIR_HOME": str(home), **server.env(),
                    "OPENAI_API_BASE": wire.api_base}
            rows: dict[str, list[float]] = {"bare": [], "model": [], "json_object": []}
            busy: dict[str, list[float]] = {"model": [], "json_object": []}
            forms: dict[int, str] = {}
            for _ in range(args.runs + 1):  # the first round warms caches and is left out
                for row in rows:
                    env = dict(base, CHOIR_MODEL_SCHEMA="json_object") \
                        if row == "json_object" else base
                    first = len(wire.exchanges)
                    took, code, _ = choir("verify", "--repo",
                                          str(work / ("bare" if row == "bare" else "model")),
                                          "--json", env=env)
                    assert code == 1, f"{row}: exit {code}, expected FAIL (1)"
                    waited = time.monotonic()
                    wire.drain(900)
                    for i in range(first, len(wire.exchanges)):
                        forms[i] = row
                    rows[row].append(took)
                    if row in busy:
                        busy[row].append(time.monotonic() - waited)
            for row, times in rows.items():
                kept = times[1:]
                ratio = statistics.median(kept) / statistics.median(rows["bare"][1:])
                extra = (f"; server busy after it: median {statistics.median(busy[row][1:]):.1f} s"
                         if row in busy else "")
                print(f"verify {row:11}: median {statistics.median(kept):6.2f} s "
                      f"({ratio:4.2f}x bare){extra}")
            for role in ("director", "reporter"):
                for row in ("model", "json_object"):
                    calls = [e for i, e in enumerate(wire.exchanges)
                             if forms.get(i) == row and e.role() == role and e.status]
                    if not calls:
                        continue
                    prompt = statistics.median(c.reply.get("usage", {}).get("prompt_tokens", 0)
                                               for c in calls)
                    written = [c.completion_tokens for c in calls]
                    print(f"calls {role:8} {row:11}: {len(calls)} calls, median "
                          f"{statistics.median(c.seconds for c in calls):6.2f} s at the server,"
                          f" prompt {prompt:.0f} / completion {statistics.median(written):.0f}"
                          f" tokens (max {max(written)}), "
                          f"{sum(valid(c) for c in calls)}/{len(calls)} valid")
            if not args.no_executor:
                executor(work, base, model, args.sandbox, wire, args.turn_tokens)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def executor(work: Path, env: dict[str, str], model: str, sandbox: str, wire: Recorder,
             turn_tokens: int) -> None:
    calc_repo(work / "exec", canary="bench", sandbox=sandbox)
    item = work / "item.yaml"
    item.write_text(textwrap.dedent(f"""\
        id: bench-smollm2
        goal: "calc.py: add(a, b) must return a + b (it returns a - b)"
        repo: ./exec
        max_attempts: 1
        executor: {{kind: llm, model: {model}, timeout_s: 120, max_turns: 4,
                   max_tokens: {turn_tokens}, verifier_max_attempts: 1}}
        """))
    first = len(wire.exchanges)
    took, code, out = choir("run", str(item), "--json", env=env)
    waited = time.monotonic()
    wire.drain(900)
    busy = time.monotonic() - waited
    calls = [e for e in wire.exchanges[first:] if e.role() == "executor" and e.status]
    status = json.loads(out)["status"] if out.strip() else f"exit {code}"
    tools = sum(bool((c.reply.get("choices") or [{}])[0].get("message", {}).get("tool_calls"))
                for c in calls)
    print(f"executor: {status} in {took:.1f} s; {len(calls)} calls, median "
          f"{statistics.median(c.seconds for c in calls):.2f} s, completion tokens median "
          f"{statistics.median(c.completion_tokens for c in calls):.0f} "
          f"(max {max(c.completion_tokens for c in calls)}), {tools} with tool calls; "
          f"server busy after it {busy:.1f} s")


if __name__ == "__main__":
    main()
