"""End to end (review 11, F2): a FAIL planned after eight PASSes reaches the ``llm`` executor.

A real ``choir run`` with the failing verifier planned 9th: the old feedback kept the first
8 reports in plan order, so the attempt-2 prompt listed 8 PASSes under "did not pass" and
never named the FAIL.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

from choir.testing import FakeModelServer, final_output
from tests import forked
from tests.workitems import PY, STEP_PY

SANDBOX = "bwrap" if shutil.which("bwrap") else "local"


def test_the_ninth_planned_fail_is_in_the_next_prompt(tmp_path: Path) -> None:
    oks = "".join(f"  ok{i}:\n    kind: lint\n    steps:\n      - name: t\n"
                  "        command: \"true\"\n" for i in range(8))
    unit = textwrap.dedent(f"""\
          unit:
            kind: unit_tests
            steps:
              - name: t
                command: "{STEP_PY} -c 'import calc; assert calc.add(2, 3) == 5'"
            timeout_s: 60
        moods:
          CALM: {{verifiers: [{", ".join(f"ok{i}" for i in range(8))}, unit]}}
        """)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(f"sandbox: {{backend: {SANDBOX}}}\nverifiers:\n" + oks + unit)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    with FakeModelServer([final_output(summary="nothing to change")],
                         repeat_last=True) as server:
        item = tmp_path / "item.yaml"
        item.write_text(textwrap.dedent(f"""\
            id: fix-add
            goal: add returns the sum
            repo: ./repo
            max_attempts: 2
            executor:
              kind: llm
              model: {server.model}
              verifier_max_attempts: 1
            """))
        env = dict(os.environ, OPENAI_API_BASE=server.api_base, OPENAI_API_KEY="sk-fake")
        forked.run([PY, "-m", "choir", "run", str(item), "--json"], capture_output=True,
                   text=True, env=env, timeout=600)
    firsts = [b["messages"][-1]["content"] for b in server.bodies if len(b["messages"]) == 2]
    assert len(firsts) == 2, f"{len(firsts)} agent runs started"
    feedback = firsts[1][firsts[1].index("The previous attempt"):]
    assert "- unit: FAIL" in feedback
    did_not_pass = feedback.split("Passed: ")[0]
    assert "ok0" not in did_not_pass and "ok7" in feedback.split("Passed: ")[1]
