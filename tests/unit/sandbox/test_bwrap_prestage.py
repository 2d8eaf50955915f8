"""bwrap as root: the base interpreter is bound when the launcher is armed, not per run.

Real bwrap, real cgroup launchers, real mounts. A run that uses the base interpreter must
pay no ``mount`` for it on its path, still see it read-only at its own path, and see it only
when its toolchain chose it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from choir.models import Limits
from choir.sandbox._cgroups import STAGE_PYTHON, prestaged_python
from choir.sandbox.bwrap import BwrapSandbox

pytestmark = pytest.mark.skipif(
    not BwrapSandbox.available() or prestaged_python() is None,
    reason="needs bwrap as root with a base interpreter a non-root user cannot reach",
)


@pytest.fixture(autouse=True)
def _home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(tmp_path / "artifacts"))
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)


def _repo(tmp_path: Path) -> tuple[Path, Path]:
    os.chmod(tmp_path, 0o700)  # like a 0700 temp folder: the repo must be staged per run
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "m.py").write_text("print('hi')\n")
    return repo, tmp_path / "out"


def _run(sb: BwrapSandbox, command: str, repo: Path, out: Path) -> tuple[int, str]:
    chunks: list[bytes] = []
    result = sb.exec(command, repo=repo, out_dir=out, env={}, timeout_s=60,
                     limits=Limits(), network=False, sink=chunks.append)
    assert result.infra_error is None, result.infra_error
    return result.exit_code, b"".join(chunks).decode()


def test_the_base_interpreter_is_not_mounted_on_the_runs_path(tmp_path: Path) -> None:
    repo, out = _repo(tmp_path)
    base = os.path.realpath(sys.base_prefix)
    setup, argv = BwrapSandbox().command("python3 -c pass", repo=repo, out_dir=out, env={},
                                         network=False)
    assert base not in setup  # no mount for it per run ...
    assert str(repo) in setup  # ... while a 0700 repo still is staged per run
    at = argv.index(STAGE_PYTHON)
    assert argv[at - 1] == "--ro-bind" and argv[at + 1] == base  # read-only, own path


def test_a_step_runs_the_prestaged_interpreter_read_only(tmp_path: Path) -> None:
    repo, out = _repo(tmp_path)
    sb = BwrapSandbox()
    try:
        base = os.path.realpath(sys.base_prefix)
        code, text = _run(sb, "python3 -c 'import sys; print(sys.base_prefix)' && "
                          f"python3 m.py && touch {base}/planted; echo touch=$?", repo, out)
    finally:
        sb.close()
    assert code == 0, text
    assert base in text and "hi" in text
    assert "touch=0" not in text
    assert not os.path.exists(f"{base}/planted")  # the host's installation is untouched


def test_the_prestaged_interpreter_is_unseen_unless_the_toolchain_chose_it(
        tmp_path: Path) -> None:
    repo, out = _repo(tmp_path)
    sb = BwrapSandbox(python="/usr/bin/python3")  # a system interpreter: nothing to bind
    base = os.path.realpath(sys.base_prefix)
    try:
        code, text = _run(sb, f"ls {base} {STAGE_PYTHON}; echo ls=$?", repo, out)
    finally:
        sb.close()
    assert code == 0, text
    assert "ls=0" not in text  # neither the host path nor the staging point is visible
