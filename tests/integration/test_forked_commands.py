"""The suite's warm ``choir`` commands (``tests.forked``) answer exactly as cold ones do: the
same exit code, output and errors, in their own folder and environment, killed at their
timeout; and whatever Python reads at its start sends a command cold."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests import forked
from tests.specrepo import NO_PLUGINS

CHOIR = forked.CHOIR
pytestmark = pytest.mark.skipif(os.environ.get("CHOIR_TESTS_COLD") == "1",
                                reason="CHOIR_TESTS_COLD=1: every command runs cold")


def _repo(tmp_path: Path, step: str) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(
        f"verification:\n  steps:\n    - {{name: s, command: {json.dumps(step)}}}\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def _both(args: list[str], **kw: object) -> tuple[subprocess.CompletedProcess[str], ...]:
    return (forked.run([*CHOIR, *args], capture_output=True, text=True, timeout=120, **kw),
            subprocess.run([*CHOIR, *args], capture_output=True, text=True, timeout=120, **kw))


@pytest.mark.parametrize("args", [["--version"], ["verify", "--repo", "/nonexistent"],
                                  ["verify", "--mood", "GRUMPY"], ["no-such-command"]])
def test_a_forked_command_says_what_a_cold_one_says(args: list[str]) -> None:
    warm, cold = _both(args)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout,
                                                           cold.stderr)


def test_a_forked_verify_runs_in_its_folder_and_environment(tmp_path: Path) -> None:
    repo = _repo(tmp_path, f"{NO_PLUGINS} test -f choir.yaml")
    homes = [tmp_path / "warm-home", tmp_path / "cold-home"]
    runs = [run([*CHOIR, "verify", "--repo", ".", "--sandbox", "local", "--json"],
                capture_output=True, text=True, timeout=120, cwd=repo,
                env=dict(os.environ, CHOIR_HOME=str(home),
                         CHOIR_ARTIFACT_DIR=str(home / "artifacts")))
            for run, home in zip((forked.run, subprocess.run), homes, strict=True)]
    for proc, home in zip(runs, homes, strict=True):
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["verdict"] == "PASS"  # `test -f` ran in the repo
        assert (home / "artifacts").is_dir()  # its own environment's home, not the suite's
    warm, cold = (json.loads(p.stdout) for p in runs)
    assert warm.keys() == cold.keys()
    assert (warm["summary"], warm["plan"]) == (cold["summary"], cold["plan"])


def test_a_forked_command_past_its_timeout_is_killed(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "sleep 71")  # a duration no other test sleeps (test_mcp pgreps)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run([*CHOIR, "verify", "--repo", str(repo), "--sandbox", "local"],
                   capture_output=True, text=True, timeout=3)
    assert time.monotonic() - started < 30


def test_what_python_reads_at_its_start_sends_a_command_cold() -> None:
    base = dict(forked._BASE_ENV)
    assert forked._starts_alike(base)
    assert forked._starts_alike({**base, "PYTHONDONTWRITEBYTECODE": "1"})  # set by the command
    assert not forked._starts_alike({**base, "PYTHONPATH": "/elsewhere"})
    assert not forked._starts_alike({**base, "PYTHONWARNINGS": "error"})
    assert not forked._starts_alike({k: v for k, v in base.items()
                                     if not k.startswith("PYTHON")} | {"PYTHONSAFEPATH": "1"})


def test_a_server_that_ended_is_started_again() -> None:
    assert forked.run([*CHOIR, "--version"], capture_output=True).returncode == 0
    assert forked._server is not None
    server = forked._server[0]
    server.kill()
    server.wait()
    again = forked.run([*CHOIR, "--version"], capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.startswith("choir")
    assert forked._server[0].pid != server.pid


def test_a_folder_that_is_not_there_raises_as_subprocess_does(tmp_path: Path) -> None:
    for run in (forked.run, subprocess.run):
        with pytest.raises(FileNotFoundError):
            run([*CHOIR, "--version"], cwd=tmp_path / "gone", capture_output=True)
