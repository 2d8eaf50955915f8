"""``choir init`` on real small projects: the file it writes, the verification it runs once,
and the existing file it never touches without --force."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from choir.config import load_repo_config
from tests import forked

CHOIR = [sys.executable, "-m", "choir"]
PYPROJECT = textwrap.dedent("""\
    [project]
    name = "calc"
    version = "0.1"
    [project.optional-dependencies]
    dev = ["pytest>=8", "mypy"]
    [tool.ruff]
    line-length = 100
    """)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    return forked.run([*CHOIR, *args], capture_output=True, text=True, env=env, timeout=300)


def project(path: Path, body: str = "def add(a: int, b: int) -> int:\n    return a + b\n") -> Path:
    path.mkdir()
    (path / "pyproject.toml").write_text(PYPROJECT)
    (path / "calc.py").write_text(body)
    (path / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add() -> None:\n    assert add(2, 3) == 5\n")
    return path


def sandbox() -> str:
    return "bwrap" if shutil.which("bwrap") else "local"


def test_init_writes_fitting_presets_and_verifies_once(tmp_path: Path) -> None:
    repo = project(tmp_path / "calc")
    proc = run("init", "--repo", str(repo), "--sandbox", sandbox(), "--mood", "SKEPTICAL",
               "--python", sys.executable)  # an interpreter that has ruff and mypy
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (repo / "choir.yaml").read_text()
    assert text.startswith("# choir.yaml: written by `choir init`")
    assert "chosen because pyproject.toml has [tool.ruff]" in text
    config = load_repo_config(repo)
    assert sorted(config.verifiers) == ["mypy", "pytest", "ruff"]
    assert config.sandbox.python == sys.executable
    assert config.verifiers["pytest"].parser == "junit"
    assert "PASS" in proc.stdout and "pytest" in proc.stdout and "ruff" in proc.stdout
    assert not list(repo.glob(".choir.yaml.*"))  # no temporary file left beside it


def test_init_on_failing_code_writes_the_file_and_exits_1(tmp_path: Path) -> None:
    repo = project(tmp_path / "calc", "def add(a: int, b: int) -> int:\n    return a - b\n")
    proc = run("init", "--repo", str(repo), "--sandbox", sandbox())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "did not pass" in proc.stderr
    assert (repo / "choir.yaml").is_file()


def test_existing_file_is_left_byte_identical_without_force(tmp_path: Path) -> None:
    repo = project(tmp_path / "calc")
    mine = b"# mine\nverifiers:\n  t: {kind: unit_tests, steps: [{name: a, command: 'true'}]}\n"
    (repo / "choir.yaml").write_bytes(mine)
    stat = (repo / "choir.yaml").stat()
    proc = run("init", "--repo", str(repo), "--no-verify")
    assert proc.returncode == 2
    assert str(repo / "choir.yaml") in proc.stderr and "--force" in proc.stderr
    assert (repo / "choir.yaml").read_bytes() == mine
    assert (repo / "choir.yaml").stat().st_mtime_ns == stat.st_mtime_ns
    assert sorted(p.name for p in repo.iterdir()) == ["calc.py", "choir.yaml", "pyproject.toml",
                                                      "test_calc.py"]
    forced = run("init", "--repo", str(repo), "--no-verify", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "uses: pytest" in (repo / "choir.yaml").read_text()


def test_setup_cfg_tox_and_package_json_are_read(tmp_path: Path) -> None:
    repo = tmp_path / "mixed"
    repo.mkdir()
    (repo / "setup.cfg").write_text("[tool:pytest]\naddopts = -q\n[mypy]\nstrict = True\n")
    (repo / "tox.ini").write_text("[testenv:lint]\ndeps =\n    ruff\n    bandit\n")
    (repo / "package.json").write_text(json.dumps(
        {"scripts": {"test": "jest", "lint": "eslint .", "start": "node x"}}))
    proc = run("init", "--repo", str(repo), "--no-verify", "--python", sys.executable)
    assert proc.returncode == 0, proc.stderr
    config = load_repo_config(repo)
    # all five are read; bandit is not installed for this interpreter, so it is skipped
    assert sorted(config.verifiers) == ["mypy", "pipeline", "pytest", "ruff"]
    assert "skipped bandit: tox.ini [testenv:lint] depends on bandit" in proc.stderr
    steps = config.verifiers["pipeline"].steps
    assert [(s.name, s.command) for s in steps] == [("lint", "npm run lint"), ("test", "npm test")]


def test_nothing_to_verify_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    repo = tmp_path / "empty"
    repo.mkdir()
    (repo / "README").write_text("hi\n")
    proc = run("init", "--repo", str(repo))
    assert proc.returncode == 2 and "fix:" in proc.stderr
    assert [p.name for p in repo.iterdir()] == ["README"]


def test_init_skips_a_configured_tool_the_interpreter_lacks_and_says_why(tmp_path: Path) -> None:
    # bandit is configured but not installed for the interpreter given: a verifier for it
    # could only ever be INCONCLUSIVE (PARANOID halted on it), so init must not write it
    repo = project(tmp_path / "calc")
    with (repo / "pyproject.toml").open("a") as fh:
        fh.write("[tool.bandit]\nskips = ['B101']\n")
    proc = run("init", "--repo", str(repo), "--no-verify", "--python", sys.executable)
    assert proc.returncode == 0, proc.stderr
    config = load_repo_config(repo)
    assert "bandit" not in config.verifiers and "pytest" in config.verifiers
    assert "skipped bandit" in proc.stderr and "not installed" in proc.stderr
    assert sys.executable in proc.stderr or str(Path(sys.executable).parent.parent) in proc.stderr
    assert "# not written: bandit" in (repo / "choir.yaml").read_text()


def test_init_lets_mypy_config_choose_the_targets(tmp_path: Path) -> None:
    # `python3 -m mypy ... .` replaced the project's `files =` and checked what the project
    # excludes: the preset's `.` must go when mypy's own config names the targets
    repo = project(tmp_path / "calc")
    (repo / "scratch.py").write_text("x: int = 'not an int'\n")  # outside files = calc.py
    (repo / "mypy.ini").write_text("[mypy]\nfiles = calc.py\n")
    proc = run("init", "--repo", str(repo), "--sandbox", sandbox(), "--mood", "SKEPTICAL",
               "--python", sys.executable)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = load_repo_config(repo)
    command = config.verifiers["mypy"].steps[0].command
    assert not command.rstrip().endswith(" ."), command
    assert "mypy" in proc.stdout and "FAIL" not in proc.stdout


def test_the_interpreter_is_inspected_never_run(tmp_path: Path) -> None:
    # the repo's .venv is the project's code: init reads its files, it does not execute it
    repo = project(tmp_path / "calc")
    venv = repo / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    marker = tmp_path / "ran"
    (venv / "bin" / "python3").unlink()
    (venv / "bin" / "python3").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (venv / "bin" / "python3").chmod(0o755)
    proc = run("init", "--repo", str(repo), "--no-verify")
    assert not marker.exists()
    assert proc.returncode == 2  # the venv has no pytest: nothing left to verify with
    assert "pytest is not installed" in proc.stderr and str(venv) in proc.stderr


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo,
                   check=True, capture_output=True)


def test_a_venv_git_does_not_ignore_is_named_with_the_gitignore_fix(tmp_path: Path) -> None:
    # the refusal spoke of symlinks and never of .gitignore, and init had already written
    # choir.yaml before verify exited 2
    repo = project(tmp_path / "calc")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(repo / ".venv")],
                   check=True)
    _git(repo, "init", "-q")
    proc = run("init", "--repo", str(repo), "--python", sys.executable)
    assert proc.returncode == 2
    assert ".gitignore" in proc.stderr and "'.venv/'" in proc.stderr
    assert not (repo / "choir.yaml").exists()
    # verify names the same fix when it meets one
    (repo / "choir.yaml").write_text("verifiers:\n  t: {kind: unit_tests, steps: "
                                     "[{name: t, command: 'true'}]}\n")
    verified = run("verify", "--repo", str(repo), "--sandbox", sandbox())
    assert verified.returncode == 2 and ".gitignore" in verified.stderr
    (repo / ".gitignore").write_text(".venv/\n")
    (repo / "choir.yaml").unlink()
    assert run("init", "--repo", str(repo), "--no-verify", "--python",
               sys.executable).returncode == 0


def test_detection_survives_any_well_formed_value_and_reads_nothing_outside_the_repo(
        tmp_path: Path) -> None:
    """Review 16, F5 and F6: values of another type (``dependencies = 5``, a string for a
    table, a list for poetry's table) or 100,000 nested brackets crashed ``choir init`` with
    a traceback and exit 1; a ``pyproject.toml`` linked outside the repo was read and acted
    on, and a ``tests`` link out of the repo was walked (to ``/``, the whole file system)."""
    from choir.cli.init import detect

    odd = tmp_path / "odd"
    odd.mkdir()
    for body in ('[project]\ndependencies = 5\n', '[project]\noptional-dependencies = "x"\n',
                 '[tool.poetry]\ndev-dependencies = ["a"]\n', 'dependency-groups = 3\n',
                 "x = " + "[" * 100_000 + "]" * 100_000 + "\n"):
        (odd / "pyproject.toml").write_text(body)
        assert detect(odd).presets == []
    (odd / "pyproject.toml").unlink()
    (odd / "package.json").write_text("[" * 100_000 + "]" * 100_000)
    assert detect(odd).npm_scripts == []
    (odd / "package.json").write_text("5")
    assert detect(odd).npm_scripts == []

    outside = tmp_path / "outside"
    (outside / "tests").mkdir(parents=True)
    (outside / "pyproject.toml").write_text("[tool.mypy]\nfiles = ['x']\n")
    (outside / "tests" / "test_x.py").write_text("def test_x(): pass\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "pyproject.toml").symlink_to(outside / "pyproject.toml")
    (linked / "tests").symlink_to(outside / "tests")
    found = detect(linked)
    assert found.presets == [] and not found.mypy_targets


def test_init_force_over_a_choir_yaml_folder_is_exit_2_naming_it(tmp_path: Path) -> None:
    """Review 16, F7: a traceback and exit 1 (IsADirectoryError from the rename)."""
    repo = project(tmp_path / "calc")
    (repo / "choir.yaml").mkdir()
    proc = run("init", "--repo", str(repo), "--force", "--no-verify", "--python", sys.executable)
    assert proc.returncode == 2, proc.stderr
    assert "choir.yaml" in proc.stderr and "is a folder" in proc.stderr and "fix:" in proc.stderr
    assert (repo / "choir.yaml").is_dir() and not list(repo.glob(".choir.yaml.*"))
