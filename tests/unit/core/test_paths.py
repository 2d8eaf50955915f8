"""Where CHOIR_HOME is: never a relative ``~`` that names a folder wherever a command runs."""

from __future__ import annotations

import pwd
import sys
from pathlib import Path

import pytest

from choir._core.paths import choir_home, home_dir
from choir.exceptions import UserError
from tests import forked


def test_the_home_is_choir_home_or_the_users_dot_choir(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "h"))
    assert home_dir() == str(tmp_path / "h") and choir_home() == tmp_path / "h"
    monkeypatch.delenv("CHOIR_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "u"))
    assert choir_home() == tmp_path / "u" / ".choir"
    monkeypatch.setenv("CHOIR_HOME", "~/elsewhere")
    assert choir_home() == tmp_path / "u" / "elsewhere"


def test_a_tilde_that_cannot_be_expanded_is_refused_not_made_relative(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With no HOME and no passwd entry, ``~/.choir`` stayed ``~/.choir``: a folder named
    ``~`` in the working directory (the repo under verification, run from there) would have
    held the key, the AHDB and the attestations. pathlib refused it; so does this."""
    monkeypatch.delenv("CHOIR_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(UserError, match="set CHOIR_HOME"):
        home_dir()
    with pytest.raises(UserError, match="set CHOIR_HOME"):
        choir_home()
    monkeypatch.setenv("CHOIR_HOME", "~no-such-user-here/choir")
    with pytest.raises(UserError, match="set CHOIR_HOME"):
        home_dir()


def test_the_cli_says_so_and_exits_2(tmp_path: Path) -> None:
    proc = forked.run([sys.executable, "-m", "choir", "verify", "--repo", str(tmp_path)],
                      env={"PATH": "/usr/bin:/bin", "CHOIR_HOME": "~no-such-user-here/x"},
                      capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "set CHOIR_HOME" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "~no-such-user-here").exists()
