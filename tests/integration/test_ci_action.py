"""``action.yml``: its steps run as a runner runs a composite action, inputs never in a script.

A runner expands ``${{ ... }}`` before the shell sees a ``run:`` script, so an input pasted
there (a claim, a resource URI, anything a workflow feeds from a pull request's title or
branch) is shell code. Every expression must sit in ``env:`` or ``with:``; the test expands
those the way the runner does and runs each ``run:`` with bash.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from tests import ghrunner
from tests.integration.test_ci_github import calc, runner_env
from tests.integration.test_verify_cli import CALC_BUG, CALC_OK, sandbox_name

ROOT = Path(__file__).resolve().parents[2]
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def action() -> dict[str, Any]:
    loaded: dict[str, Any] = YAML(typ="safe").load((ROOT / "action.yml").read_text())
    return loaded


def test_no_expression_reaches_a_script() -> None:
    spec = action()
    assert spec["runs"]["using"] == "composite"
    steps = spec["runs"]["steps"]
    for step in steps:
        assert "${{" not in step.get("run", ""), step["name"]
    uses = [s for s in steps if "uses" in s]
    assert [s["uses"] for s in uses] == ["actions/upload-artifact@v4"]
    upload = uses[0]
    assert "!cancelled()" in upload["if"]  # the evidence is uploaded when the check fails too
    assert upload["with"]["path"] == "${{ steps.choir.outputs.paths }}"
    for name, out in spec["outputs"].items():
        assert out["value"] == f"${{{{ steps.choir.outputs.{name} }}}}"


def expand(value: str, inputs: dict[str, str], runner_temp: Path, base_sha: str = "") -> str:
    """A runner's expansion of the expressions the action uses (others are refused);
    ``base_sha``: the pull request's base in the event (empty: not a pull request)."""

    def one(match: re.Match[str]) -> str:
        expr = match.group(1)
        if expr.startswith("inputs."):
            return inputs[expr.removeprefix("inputs.")]
        known = {"runner.temp": str(runner_temp), "github.action_path": str(ROOT),
                 "github.event.pull_request.base.sha": base_sha}
        assert expr in known, f"an expression the test does not model: {expr}"
        return known[expr]

    return EXPR.sub(one, value)


# pip compiles every module it installs (litellm's 3,000 among them), which is most of an
# install's CPU; what these tests show does not depend on it. (pip reads ``PIP_NO_COMPILE=1``
# as ``--compile``: its boolean options take the value of their positive name.)
NO_COMPILE = {"PIP_COMPILE": "0"}


def run_action_step(name: str, tmp_path: Path, given: dict[str, str], base_sha: str = "",
                    extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    spec = action()
    env = runner_env(tmp_path)
    for var in [v for v in env if v.startswith("CHOIR_CI_")]:
        del env[var]  # only what the step's env: sets
    runner_temp = Path(env["RUNNER_TEMP"])
    # an input's default is an expression too, evaluated in the event's context
    inputs = {k: expand(str(v.get("default", "")), {}, runner_temp, base_sha)
              for k, v in spec["inputs"].items()} | given
    step = next(s for s in spec["runs"]["steps"] if s["name"] == name)
    env |= {k: expand(str(v), inputs, runner_temp) for k, v in step.get("env", {}).items()}
    cwd = expand(step.get("working-directory", str(tmp_path / "ws")), inputs, runner_temp)
    return subprocess.run(["bash", "-e", "-c", step["run"]], env=env | (extra_env or {}), cwd=cwd,
                          capture_output=True, text=True, timeout=900)


def test_the_verify_step_runs_from_its_env_alone(tmp_path: Path) -> None:
    calc(tmp_path, CALC_OK)
    venv = tmp_path / "runner-temp" / "choir-venv"
    venv.parent.mkdir(exist_ok=True)
    venv.symlink_to(sys.prefix)  # as if the install step had run (it is the slow test below)
    # a hostile input: pasted into the script it would run; from env it is only a string
    marker = tmp_path / "pwned"
    proc = run_action_step("Verify and gate", tmp_path, {
        "repo": "repo", "mood": "skeptical", "claim": "pr-7",
        "sandbox": sandbox_name(),
        "resource-uri": f"git+https://x/y'; touch {marker}; echo '"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not marker.exists()
    out = ghrunner.outputs(tmp_path / "output")
    assert set(action()["outputs"]) <= set(out)
    assert out["status"] == "PASS"
    home = tmp_path / "runner-temp" / "choir-home"  # CHOIR_HOME from the step's env
    assert (home / "ahdb.sqlite").exists()
    assert (tmp_path / "runner-temp" / "choir-ci" / "choir.intoto.jsonl").is_file()
    assert "pr-7" in (tmp_path / "summary").read_text()


@pytest.mark.slow
def test_the_install_step_installs_choir_from_the_action(tmp_path: Path) -> None:
    """The whole action but the upload: pip installs Choir (and its dependencies, from the
    package index) into a fresh venv, then the verify step runs with it."""
    calc(tmp_path, CALC_OK)
    installed = run_action_step("Install Choir", tmp_path, {"python": sys._base_executable,
                                                            "extras": ""}, extra_env=NO_COMPILE)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (tmp_path / "runner-temp" / "choir-venv" / "bin" / "choir-ci").is_file()
    proc = run_action_step("Verify and gate", tmp_path, {
        "repo": "repo", "sandbox": sandbox_name()})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ghrunner.outputs(tmp_path / "output")["status"] == "PASS"


def test_a_self_hosted_runners_next_job_starts_afresh(tmp_path: Path) -> None:
    """Found by a review: the home is the runner's temp folder, emptied before every job,
    but the mark of how far its log had grown stayed in ``~/.config/choir/seen-heads``, so
    on a self-hosted runner every job after the first read a rolled-back log and failed."""
    calc(tmp_path, CALC_OK)
    for job in (1, 2):
        temp = tmp_path / "runner-temp"
        shutil.rmtree(temp, ignore_errors=True)  # what the runner does before a job
        temp.mkdir()
        (temp / "choir-venv").symlink_to(sys.prefix)
        proc = run_action_step("Verify and gate", tmp_path, {"repo": "repo",
                                                             "sandbox": sandbox_name()})
        assert proc.returncode == 0, (job, proc.stdout + proc.stderr)
        assert ghrunner.outputs(tmp_path / "output")["status"] == "PASS"
        (tmp_path / "output").write_text("")


WRITE_MARK = "import os\nopen(os.environ['MARK'], 'w').write(__file__)\n"
PLANTED = {"venv": {"venv.py": WRITE_MARK},
           "pip": {"pip/__init__.py": "", "pip/__main__.py": WRITE_MARK}}


@pytest.mark.parametrize("planted", list(PLANTED))
def test_a_pull_requests_module_never_runs_as_the_install_step(
        tmp_path: Path, planted: str) -> None:
    """Found by a review: the install step ran ``python -m venv`` and ``python -m pip`` in
    the workspace, which is the pull request's checkout (actions/checkout's default path),
    and ``python -m`` imports from the working directory first: a ``venv.py`` or ``pip/``
    there ran as the job, before any check, and could install a ``choir-ci`` of its own
    that says PASS. Here the checkout is the workspace itself; a real venv is made and pip
    (offline) fails to find Choir's dependencies, which is all the test needs."""
    for rel, text in PLANTED[planted].items():
        (tmp_path / "ws" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ws" / rel).write_text(text)
    (tmp_path / "runner-temp").mkdir()
    mark = tmp_path / "ran-as-the-job"
    proc = run_action_step("Install Choir", tmp_path, {"python": sys._base_executable,
                                                      "extras": ""},
                           extra_env={"MARK": str(mark), "PIP_NO_INDEX": "1"})
    assert not mark.exists(), (mark.read_text(), proc.stdout, proc.stderr)
    assert (tmp_path / "runner-temp" / "choir-venv" / "bin" / "python").exists(), proc.stderr


def test_on_a_pull_request_the_base_branchs_checks_decide(tmp_path: Path) -> None:
    """Found by a review: the check trusted the pull request's own tests and choir.yaml. A
    pull request that breaks ``add`` and weakens its test passes when the event names no
    base (a push), and fails by default on a pull request: the base's test runs, and the
    edited one is held for a person."""
    repo = calc(tmp_path, CALC_OK)
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    (repo / "calc.py").write_text(CALC_BUG)
    (repo / "test_calc.py").write_text("def test_add():\n    assert True\n")
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qam", "pr"], check=True)
    venv = tmp_path / "runner-temp" / "choir-venv"
    venv.parent.mkdir(exist_ok=True)
    venv.symlink_to(sys.prefix)
    given = {"repo": "repo", "sandbox": sandbox_name()}
    pushed = run_action_step("Verify and gate", tmp_path, given)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr  # the tree's own checks
    warned = [c for c in ghrunner.commands(pushed.stdout) if c[0] == "warning"]
    assert [c[1]["title"] for c in warned] == ["choir: the checks are the tree's own"]
    for name in ("output", "summary"):
        (tmp_path / name).write_text("")
    proc = run_action_step("Verify and gate", tmp_path, given, base_sha=base)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = ghrunner.outputs(tmp_path / "output")
    assert out["status"] == "FAIL" and out["gate"] == "refused"
    errors = {c[1].get("title"): c[2] for c in ghrunner.commands(proc.stdout) if c[0] == "error"}
    assert "held for a person" in errors["choir: the base's checks were changed"]
    summary = (tmp_path / "summary").read_text()
    assert "### Checks" in summary and f"= {base[:12]}" in summary
    assert "modified: test_calc.py" in summary
