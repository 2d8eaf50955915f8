"""Where Choir keeps things: CHOIR_HOME, and the artifact store (README, "Storage")."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pathlib import Path


def home_dir() -> str:
    """``choir_home()`` as a string: the warm client's (``choir.serve.client``), which
    imports no ``pathlib`` (with its ``urllib`` and ``ipaddress``: 4-6 ms)."""
    return os.path.expanduser(os.environ.get("CHOIR_HOME")
                              or os.path.join(os.path.expanduser("~"), ".choir"))


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
