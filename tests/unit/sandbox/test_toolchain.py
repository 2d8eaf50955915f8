"""#10.1: what a step may see is chosen exactly; binds that would expose secrets are refused."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from choir.config import load_repo_config
from choir.exceptions import ConfigError
from choir.sandbox._toolchain import check_bind, choose

CONFIG = """verification:
  steps: [{name: t, command: "true"}]
sandbox:
  backend: bwrap
  binds:
    - {bind}
"""


def test_a_bind_containing_choir_home_is_refused_with_file_and_line(tmp_path: Path) -> None:
    home = Path(os.environ["CHOIR_HOME"])  # the suite's private CHOIR_HOME (conftest)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(CONFIG.replace("{bind}", str(home.parent)))
    with pytest.raises(ConfigError) as caught:
        load_repo_config(repo)
    assert caught.value.line == 6 and str(repo / "choir.yaml") in str(caught.value)
    assert "signing key" in str(caught.value)


@pytest.mark.parametrize("path", ["/", "/run", "relative/bin", "/proc/self"])
def test_host_wide_and_relative_binds_are_refused(path: str) -> None:
    with pytest.raises(ConfigError):
        check_bind(path, origin="test")


def test_home_is_never_bound_even_with_home_bin_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", f"{tmp_path}/bin:bin:{os.environ['PATH']}")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    tools = choose(tmp_path / "repo")
    assert all(not str(tmp_path).startswith(b) for b in tools.binds)
    assert os.path.realpath(sys.prefix) not in tools.binds or sys.prefix == sys.base_prefix


def test_a_configured_interpreter_binds_its_installation(tmp_path: Path) -> None:
    tools = choose(tmp_path, python=os.path.realpath(sys.executable))
    base = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    assert tools.venv is None
    assert tools.path_head[0] == f"{base}/bin"


@pytest.mark.parametrize("inside", ["keys", "heldout/calc", "artifacts"])
def test_a_bind_inside_choir_home_is_refused(inside: str, choir_home: Path) -> None:
    """A bind may be a link planted in the repo (tests/integration/test_planted_binds.py):
    inside Choir's home is as bad as containing it."""
    (choir_home / inside).mkdir(parents=True, exist_ok=True)
    with pytest.raises(ConfigError, match="store of Choir's"):
        check_bind(str(choir_home / inside), origin="test")


def test_a_bind_inside_home_is_allowed_where_repos_and_interpreters_live(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "project" / "data").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert check_bind(str(tmp_path / "project" / "data"), origin="test") == os.path.realpath(
        tmp_path / "project" / "data")


def test_a_bind_into_a_heldout_folder_outside_the_home_is_refused_with_file_and_line(
        tmp_path: Path, choir_home: Path) -> None:
    hidden = tmp_path / "hidden-checks"
    (hidden / "calc").mkdir(parents=True)
    (hidden / "calc" / "test_hidden.py").write_text("def test_x(): pass\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    (choir_home / "heldout.yaml").write_text(f"""repos:
  - repo: {repo}
    verifiers:
      hidden:
        kind: integration_tests
        path: {hidden}
        steps: [{{name: t, command: pytest -q $CHOIR_HELDOUT}}]
""")
    (repo / "choir.yaml").write_text(CONFIG.replace("{bind}", str(hidden / "calc")))
    with pytest.raises(ConfigError, match="store of Choir's") as caught:
        load_repo_config(repo)
    assert caught.value.line == 6 and str(repo / "choir.yaml") in str(caught.value)


def test_a_huge_or_special_pyvenv_cfg_is_no_venv_and_is_never_read_whole(
        tmp_path: Path) -> None:
    """Review 16, F6: a repo's ``.venv/pyvenv.cfg`` linked to a 400 MB file was read whole
    (864 MB of Choir's memory). At most 64 KiB of a regular file is read now."""
    from choir.sandbox import _toolchain

    venv = tmp_path / ".venv"
    venv.mkdir()
    with open(tmp_path / "huge", "wb") as fh:
        fh.truncate(_toolchain.PYVENV_MAX + 2)  # sparse: costs no disk
    (venv / "pyvenv.cfg").symlink_to(tmp_path / "huge")
    assert _toolchain._venv_base(venv) is None
    (venv / "pyvenv.cfg").unlink()
    os.mkfifo(venv / "pyvenv.cfg")  # a FIFO would block a plain read forever
    assert _toolchain._venv_base(venv) is None
    (venv / "pyvenv.cfg").unlink()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert _toolchain._venv_base(venv) == "/usr"


def test_a_repos_venv_naming_a_folder_that_is_no_python_is_never_bound(
        tmp_path: Path) -> None:
    """Review 16f: a repo's ``.venv/pyvenv.cfg`` saying ``home = ~/.ssh/bin`` made the
    step's sandbox bind ``~/.ssh`` (read-only) as "the project's Python", and a step read
    the private key there. Only a Python installation is bound."""
    secrets = tmp_path / "secrets"
    (secrets / "bin").mkdir(parents=True)
    (secrets / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    cfg = repo / ".venv" / "pyvenv.cfg"
    cfg.write_text(f"home = {secrets / 'bin'}\n")
    with pytest.raises(ConfigError, match="not a venv"):
        choose(repo)
    cfg.write_text(f"home = {sys.base_prefix}/bin\n")  # a real installation: bound
    assert os.path.realpath(sys.base_prefix) in " ".join(choose(repo).binds) or \
        os.path.realpath(sys.base_prefix).startswith(("/usr",))


@pytest.mark.parametrize("layout", [("python3.11", "python3.11"), ("pypy3.10", "pypy3.10")])
def test_an_altinstall_or_pypy_base_is_an_installation(
        tmp_path: Path, layout: tuple[str, str]) -> None:
    """A second review: ``make altinstall`` makes only ``bin/python3.X``, PyPy keeps
    ``lib/pypy3.X``; their venvs were refused as "not a venv" once only an installation's
    home was bound."""
    binary, lib = layout
    base = tmp_path / "opt"
    (base / "bin").mkdir(parents=True)
    (base / "lib" / lib).mkdir(parents=True)
    (base / "bin" / binary).write_text("#!/bin/sh\n")
    (base / "bin" / binary).chmod(0o755)
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\n")
    assert str(base) in choose(repo).binds
