"""Where Choir keeps things: CHOIR_HOME, and the artifact store (README, "Storage")."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pathlib import Path


def home_dir() -> str:
    """``choir_home()`` as a string: the warm client's (``choir.serve.client``), which
    imports no ``pathlib`` (with its ``urllib`` and ``ipaddress``: 4-6 ms).

    Raises:
        UserError: a ``~`` that cannot be expanded (no ``HOME`` and no passwd entry, or an
            unknown ``~user``): it would name a folder ``~`` in whatever directory the
            command runs in, the repo under verification included.
    """
    value = os.environ.get("CHOIR_HOME") or os.path.join("~", ".choir")
    found = os.path.expanduser(value)
    if found.startswith("~"):
        from choir._core.errors import UserError

        raise UserError(f"CHOIR_HOME {value!r}: no home folder is known to expand '~' (HOME "
                        "is unset and this user has no passwd entry, or the user is "
                        "unknown)\n  fix: set CHOIR_HOME to an absolute path")
    return found


def choir_home() -> Path:
    """``CHOIR_HOME``, default ``~/.choir``: keys, the AHDB, checkpoints, attestations."""
    from pathlib import Path

    return Path(home_dir())


def artifact_dir() -> Path:
    """``CHOIR_ARTIFACT_DIR``, else ``AGENT_ARTIFACT_DIR``, else under CHOIR_HOME."""
    from pathlib import Path

    for var in ("CHOIR_ARTIFACT_DIR", "AGENT_ARTIFACT_DIR"):
        value = os.environ.get(var)
        if value:
            return Path(value).expanduser()
    return choir_home() / "artifacts"
