"""Agent programs as executors: ``uses: claude-code`` (codex, aider, opencode) end to end.

Each preset runs a stand-in program installed on PATH as the real CLI's name
(``tests/agent_clis.py``): it parses the real CLI's non-interactive flags, calls a model
API on 127.0.0.1 over real HTTP through the sandbox's egress, and edits the repo as the
model says. A whole ``choir run`` must reach ASSERT: the first attempt's edit is wrong,
the verifiers FAIL it, and the second prompt carries their bounded findings (never the raw
log), after which the model's fix passes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests import forked
from tests.agent_clis import API_KEY, ModelAPI, edits, install_standins
from tests.workitems import FIXED, PY, calc_repo

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
              pytest.mark.bwrap,
              pytest.mark.slow]  # CI's slow stage: the README's command stays under five minutes

CANARY = "CANARY-raw-verifier-output-agent-presets"
# what Choir itself gives an executor: its inputs, its output folder, the way out
CHOIR_GIVEN = {"CHOIR_ATTEMPT", "CHOIR_WORKITEM_FILE", "CHOIR_FEEDBACK_FILE", "CHOIR_PROMPT_FILE",
               "CHOIR_RUN_ID", "CHOIR_OUT", "CHOIR_EGRESS_PROXY", "CHOIR_EGRESS_TUNNELS",
               "CHOIR_PYTEST"}  # every sandboxed step's: pytest with Choir's JUnit writer
STILL_WRONG = "def add(a, b):\n    return a * b\n"
# what each preset reads to find its model API, pointed at the stand-in model server
BASE_URL = {
    "claude-code": lambda api: {"ANTHROPIC_BASE_URL": f"http://{api.host}",
                                "ANTHROPIC_API_KEY": API_KEY},
    "codex": lambda api: {"OPENAI_BASE_URL": f"http://{api.host}/v1", "OPENAI_API_KEY": API_KEY},
    "aider": lambda api: {"OPENAI_API_BASE": f"http://{api.host}/v1", "OPENAI_API_KEY": API_KEY},
    "opencode": lambda api: {"OPENCODE_CONFIG_CONTENT": json.dumps({"provider": {"openai": {
        "options": {"baseURL": f"http://{api.host}/v1", "apiKey": API_KEY}}}})},
}


def model(prompt: str) -> str:
    """Wrong first; once the findings name the failing test, the fix."""
    if "The previous attempt was verified" in prompt and "test_add" in prompt:
        return edits("add adds", {"calc.py": FIXED})
    return edits("add multiplies (a guess)", {"calc.py": STILL_WRONG})


# a whole run each (about 10 s here): one in the README's command, the others in CI's slow
# stage; the proxy and tunnel paths the others take are covered in test_egress.py as well
@pytest.mark.parametrize("preset", [
    "claude-code", *(pytest.param(p, marks=pytest.mark.slow) for p in ("aider", "codex",
                                                                      "opencode"))])
def test_each_preset_reaches_assert_through_its_real_cli_interface(
        tmp_path: Path, choir_home: Path, preset: str) -> None:
    repo = calc_repo(tmp_path / "repo", canary=CANARY, sandbox="bwrap")
    bin_dir = install_standins(tmp_path / "bin")
    with ModelAPI(model) as api:
        item = tmp_path / "item.yaml"
        item.write_text(f"id: fix-add\ngoal: add(a, b) must return the sum\nrepo: ./repo\n"
                        f"executor:\n  uses: {preset}\n  hosts: ['{api.host}']\n")
        env = {**os.environ, **BASE_URL[preset](api), "PATH": f"{bin_dir}:{os.environ['PATH']}",
               "UNRELATED_SECRET": "must-not-reach-the-agent"}
        proc = forked.run([PY, "-m", "choir", "run", str(item), "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "asserted", out
    assert (repo / "calc.py").read_text() == FIXED
    assert [c.headers["x-standin"] for c in api.calls] == \
        [{"claude-code": "claude"}.get(preset, preset)] * 2
    first, second = (c.prompt for c in api.calls)
    assert "add(a, b) must return the sum" in first
    assert "The previous attempt was verified" not in first
    assert "test_add" in second  # the bounded findings: the failing test's id
    assert CANARY not in first + second  # never the raw verifier log
    for call in api.calls:
        seen = set(call.headers["x-standin-env"].split(","))
        assert "UNRELATED_SECRET" not in seen, "the agent saw a variable no preset names"
        assert {name for name in seen if name.startswith("CHOIR_")} <= CHOIR_GIVEN, seen
        home = call.headers["x-standin-home"]
        assert home.startswith("/tmp/") and "choir-exec-" in home, home  # private, per attempt
    assert not (Path.home() / ".claude" / "standin-session.json").exists()
    atts = [json.loads(p.read_text()) for p in (choir_home / "attestations").rglob("*.json")]
    assert atts and {a["body"]["executor_isolation"] for a in atts} == {"namespace"}
