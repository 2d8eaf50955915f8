"""Choosing the store: CHOIR_DATABASE_URL, else ``store: {url:}`` in $CHOIR_HOME/config.yaml.

A typo must never fall back to a private SQLite file (the state would silently split
between machines), so every wrong value is a ConfigError naming where it came from.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.config.store_url import database_url
from choir.exceptions import ConfigError
from tests import forked


def test_unset_means_the_embedded_sqlite(choir_home: Path) -> None:
    assert database_url() is None


def test_the_environment_wins_over_the_file(choir_home: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (choir_home / "config.yaml").write_text("store:\n  url: postgresql://a@h/file\n")
    assert database_url() == "postgresql://a@h/file"
    monkeypatch.setenv("CHOIR_DATABASE_URL", "postgres://b@h/env")
    assert database_url() == "postgres://b@h/env"


def test_a_wrong_scheme_names_the_file_and_line(choir_home: Path) -> None:
    (choir_home / "config.yaml").write_text("# shared state\nstore:\n  url: mysql://x/y\n")
    with pytest.raises(ConfigError) as err:
        database_url()
    assert err.value.line == 3 and err.value.path == str(choir_home / "config.yaml")
    assert "postgresql://" in str(err.value)


def test_a_wrong_env_value_is_refused_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOIR_DATABASE_URL", "sqlite:///tmp/x")
    with pytest.raises(ConfigError, match="CHOIR_DATABASE_URL"):
        database_url()


def test_an_unknown_key_under_store_is_refused(choir_home: Path) -> None:
    (choir_home / "config.yaml").write_text("store:\n  uri: postgresql://a@h/db\n")
    with pytest.raises(ConfigError) as err:
        database_url()
    assert err.value.line == 1


def test_the_cli_exits_2_on_a_bad_store_url(monkeypatch: pytest.MonkeyPatch,
                                            choir_home: Path) -> None:
    import sys

    monkeypatch.setenv("CHOIR_DATABASE_URL", "mysql://x/y")
    done = forked.run([sys.executable, "-m", "choir", "ahdb", "list"], capture_output=True,
                      text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "CHOIR_DATABASE_URL" in done.stderr and "Traceback" not in done.stderr
    assert not (choir_home / "ahdb.sqlite").exists()  # no silent fallback to a local file


def test_an_unreachable_server_is_a_clear_error_not_a_pass(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from choir.ahdb import open_ahdb
    from choir.exceptions import UserError

    monkeypatch.setenv("CHOIR_DATABASE_URL",
                       f"postgresql://u:secret@/db?host={tmp_path}/nothing-here")
    with pytest.raises(UserError, match="cannot reach the store") as err:
        open_ahdb()
    assert "secret" not in str(err.value)
