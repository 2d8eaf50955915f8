"""Where the shared control state lives: ``CHOIR_DATABASE_URL``, else ``store: {url:}``.

Unset, Choir keeps everything in SQLite and files under ``CHOIR_HOME`` (the embedded default).
Set to a ``postgresql://`` URL, the AHDB, the attestation index, the LangGraph checkpoints
and run leases go to that Postgres database, so several runners on several machines share
one control state. The user config is ``$CHOIR_HOME/config.yaml``; the environment wins, so
one CI job can point elsewhere without editing a file. A wrong value is a ConfigError naming
the file and line: a typo must never fall back silently to a private SQLite file, which
would split the state between machines.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from choir._core.paths import choir_home
from choir.exceptions import ConfigError

ENV = "CHOIR_DATABASE_URL"
SCHEMES = ("postgresql", "postgres")


def user_config_path(home: Path | None = None) -> Path:
    return (home or choir_home()) / "config.yaml"


def _check(url: str, *, path: str, line: int | None) -> str:
    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise ConfigError(f"the store URL {url[:60]!r} is not a PostgreSQL URL", path=path,
                          line=line, hint="write postgresql://USER@HOST/DB (or leave it unset "
                                          "for the embedded SQLite store)")
    return url


def database_url(home: Path | None = None) -> str | None:
    """The Postgres URL to use, or None for the embedded SQLite store.

    Raises:
        ConfigError: the variable or ``store.url`` is set but is not a PostgreSQL URL, or the
            config file is malformed.
    """
    env = os.environ.get(ENV)
    if env is not None and env.strip():
        return _check(env.strip(), path=f"${ENV}", line=None)
    path = user_config_path(home)
    if not os.path.lexists(path):  # a folder or a dangling link is a mistake load_yaml names
        return None
    from choir.config._yaml import load_yaml

    doc = load_yaml(path)
    if doc.data is None:
        return None
    if not isinstance(doc.data, dict):
        raise ConfigError("the user config must be a mapping", path=str(path), line=1,
                          hint="store: {url: postgresql://USER@HOST/DB}")
    store = doc.data.get("store")
    if store is None:
        return None
    if not isinstance(store, dict) or set(store) - {"url"}:
        raise ConfigError("'store' takes exactly one key, 'url'", path=str(path),
                          line=doc.line_of(["store"]),
                          hint="store: {url: postgresql://USER@HOST/DB}")
    url = store.get("url")
    if url is None:
        return None
    if not isinstance(url, str):
        raise ConfigError("'store.url' must be a string", path=str(path),
                          line=doc.line_of(["store", "url"]),
                          hint="store: {url: postgresql://USER@HOST/DB}")
    return _check(url.strip(), path=str(path), line=doc.line_of(["store", "url"]))
