"""Where Choir keeps things: CHOIR_HOME, and the artifact store (README, "Storage")."""

from __future__ import annotations

import os
from pathlib import Path


def choir_home() -> Path:
    """``CHOIR_HOME``, default ``~/.choir``: keys, the AHDB, checkpoints, attestations."""
    return Path(os.environ.get("CHOIR_HOME") or Path.home() / ".choir").expanduser()


def artifact_dir() -> Path:
    """``CHOIR_ARTIFACT_DIR``, else ``AGENT_ARTIFACT_DIR``, else under CHOIR_HOME."""
    for var in ("CHOIR_ARTIFACT_DIR", "AGENT_ARTIFACT_DIR"):
        value = os.environ.get(var)
        if value:
            return Path(value).expanduser()
    return choir_home() / "artifacts"
