"""Files in ``$CHOIR_HOME`` that only add checks: absent means none, anything else is read.

Review 16c: a ``heldout.yaml`` that was a dangling link (a dotfiles repo that moved) or a
folder read as "no held-out checks", so PARANOID, which requires them, PASSed without
them; a dangling ``revoked_keys`` link read as "nothing revoked", and a folder in place of
``config.yaml`` meant the embedded store. Each is a ConfigError naming the file now.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from choir.attest.keys import REVOKE_FILE, revoked_key_ids
from choir.config.heldout import heldout_file, load_heldout
from choir.config.store_url import database_url
from choir.exceptions import ConfigError
from tests import forked

READERS: dict[str, tuple[Callable[[Path], Path], Callable[[Path], object]]] = {
    "heldout.yaml": (lambda home: heldout_file(), lambda repo: load_heldout(repo)),
    "revoked_keys": (lambda home: home / REVOKE_FILE, lambda repo: revoked_key_ids()),
    "config.yaml": (lambda home: home / "config.yaml", lambda repo: database_url()),
}


@pytest.mark.parametrize("name", list(READERS))
@pytest.mark.parametrize("shape", ["dangling link", "folder"])
def test_a_home_file_that_is_not_a_file_is_an_error_not_absence(
        choir_home: Path, tmp_path: Path, name: str, shape: str) -> None:
    where, read = READERS[name]
    path = where(choir_home)
    assert not os.path.lexists(path)
    read(tmp_path)  # absent: none, no error
    if shape == "folder":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "moved-away")
    with pytest.raises(ConfigError) as raised:
        read(tmp_path)
    assert str(path) in str(raised.value) or name in str(raised.value)


@pytest.mark.parametrize("value", ["abc", "-1", "0", "99999999999999999999999"])
def test_a_size_cap_that_is_no_size_is_refused_not_ignored(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """Review 16c: ``abc`` and ``-1`` were ignored silently, a huge number overflowed a
    read with a traceback."""
    from choir._core.errors import UserError
    from choir.config._yaml import max_bytes

    monkeypatch.setenv("CHOIR_CONFIG_MAX_BYTES", value)
    with pytest.raises(UserError, match="CHOIR_CONFIG_MAX_BYTES"):
        max_bytes()
    monkeypatch.setenv("CHOIR_CONFIG_MAX_BYTES", "2048")
    assert max_bytes() == 2048


def test_an_artifact_folder_that_is_a_file_is_exit_2_naming_it(tmp_path: Path) -> None:
    import sys

    (tmp_path / "afile").write_text("x")
    proc = forked.run([sys.executable, "-m", "choir", "runs", "list"],
                      capture_output=True, text=True, timeout=120,
                      env={**os.environ, "CHOIR_ARTIFACT_DIR": str(tmp_path / "afile")})
    assert proc.returncode == 2 and "CHOIR_ARTIFACT_DIR" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
