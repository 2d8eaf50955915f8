"""MCP ``verify`` verifies with the choir.yaml the server pinned, or not at all (review 11, F4).

The old tool checked the pin before and after the verification, but the verification read
the live file in between: an agent that rewrote choir.yaml right after the pre-check had its
weakened allowlist run, and with ``claim`` the ASSERT was recorded before the post-check
refused the answer, so the ``gate`` tool and ``choir gate`` opened for the tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

import choir.app.verify as verify_module
import choir.mcp.tools as tools_module
from choir.exceptions import UserError
from choir.mcp.args import GateArgs, ListRunsArgs, VerifyArgs
from choir.mcp.scope import Scope
from choir.mcp.tools import Tools
from tests import forked

PY = os.path.realpath(sys.executable)
SANDBOX = "bwrap" if shutil.which("bwrap") else "local"
STRICT = textwrap.dedent(f"""\
    verifiers:
      unit:
        kind: unit_tests
        steps:
          - name: t
            command: "{PY} -c 'import calc; assert calc.add(2, 3) == 5'"
        timeout_s: 60
    """)
WEAK = STRICT.replace(f"{PY} -c 'import calc; assert calc.add(2, 3) == 5'", "true")


def _repo(path: Path) -> Path:
    path.mkdir()
    (path / "choir.yaml").write_text(STRICT)
    (path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)
    return path


def test_an_edit_after_the_pre_check_records_no_claim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOIR_SERVE", "off")
    repo = _repo(tmp_path / "calc")
    tools = Tools(Scope.open([repo]), sandbox=SANDBOX)
    real = verify_module.averify_tree

    async def the_agent_edits_during_the_run(*args: Any, **kwargs: Any) -> Any:
        (repo / "choir.yaml").write_text(WEAK)  # lands after the pre-check, deterministically
        return await real(*args, **kwargs)

    monkeypatch.setattr(verify_module, "averify_tree", the_agent_edits_during_the_run)

    async def main() -> None:
        with pytest.raises(UserError, match="changed since `choir mcp` started"):
            await tools.verify(VerifyArgs(claim="fix-add"))

    anyio.run(main)
    gate = tools.gate(GateArgs(work_item="fix-add"))
    assert gate["passed"] is False
    assert tools.list_runs(ListRunsArgs())["stored"] == 0  # refused before anything ran
    gate_cli = forked.run([sys.executable, "-m", "choir", "gate", "fix-add", "--repo",
                           str(repo)], capture_output=True, text=True, timeout=120)
    assert gate_cli.returncode != 0, gate_cli.stdout


def test_the_pin_travels_to_a_service_worker(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `choir serve`, the worker runs `choir verify` from the argv: the pin is in it,
    and `choir verify` itself refuses a file whose bytes are not the pinned ones."""
    repo = _repo(tmp_path / "calc")
    scope = Scope.open([repo])
    sent: list[list[str]] = []

    def no_service(request: dict[str, Any]) -> tuple[None, None]:
        sent.append(list(request["argv"]))
        return None, None

    monkeypatch.setattr(tools_module, "_service_call", no_service)
    monkeypatch.setenv("CHOIR_SERVE", "off")
    anyio.run(Tools(scope, sandbox=SANDBOX).verify, VerifyArgs(claim="fix-add"))
    line = sent[0]
    assert line[line.index("--pinned-config") + 1] == scope.repos[0].config_hash

    before = Tools(scope).list_runs(ListRunsArgs())["stored"]
    assert before == 1
    (repo / "choir.yaml").write_text(WEAK)
    proc = forked.run([sys.executable, "-m", "choir", "verify", "--repo", str(repo),
                       "--json", "--sandbox", SANDBOX, "--claim", "weak",
                       "--pinned-config", scope.repos[0].config_hash],
                      capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "not the one pinned" in proc.stderr
    gate = forked.run([sys.executable, "-m", "choir", "gate", "weak", "--repo", str(repo)],
                      capture_output=True, text=True, timeout=120)
    assert gate.returncode != 0
    assert Tools(scope).list_runs(ListRunsArgs())["stored"] == before  # nothing ran


PYTEST_YAML = textwrap.dedent(f"""\
    verifiers:
      unit:
        kind: unit_tests
        steps:
          - name: t
            command: "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {PY} -m pytest -q -p no:cacheprovider"
        timeout_s: 120
    """)
PASS_EVERYTHING = textwrap.dedent("""\
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        outcome.get_result().outcome = "passed"
    """)


def test_an_agents_edit_of_the_checks_never_asserts_its_claim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 16f: the agent (the executor being verified) wrote a ``conftest.py`` that
    marks every report passed, asked ``verify`` with a claim in PARANOID, and its claim
    was ASSERTed, the gate open, ``add`` still broken: the pin covered choir.yaml, and the
    tests were the agent's. A claim is verified with the checks of the commit the server
    started on now, as a pull request is against its base."""
    monkeypatch.setenv("CHOIR_SERVE", "off")
    repo = tmp_path / "calc"
    repo.mkdir()
    (repo / "choir.yaml").write_text(PYTEST_YAML)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n"
                                       "    assert add(2, 3) == 5\n")
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    tools = Tools(Scope.open([repo]), sandbox=SANDBOX)
    (repo / "conftest.py").write_text(PASS_EVERYTHING)  # the agent, after the start

    async def main() -> dict[str, Any]:
        return await tools.verify(VerifyArgs(claim="fix-add", mood="PARANOID"))

    answer = anyio.run(main)
    assert answer["status"] != "PASS", answer
    assert tools.gate(GateArgs(work_item="fix-add"))["passed"] is False
    gate = forked.run([sys.executable, "-m", "choir", "gate", "fix-add", "--repo",
                       str(repo)], capture_output=True, text=True, timeout=120)
    assert gate.returncode != 0, gate.stdout
