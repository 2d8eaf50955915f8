"""Run ids: one scheme for ``choir verify`` sessions, ``choir run`` runs and green threads."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime


def new_run_id(prefix: str) -> str:
    """A sortable, unique run id: prefix, UTC time, random suffix."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"{prefix}-{stamp}-{secrets.token_hex(3)}"
