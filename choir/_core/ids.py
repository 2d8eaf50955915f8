"""Run ids: one scheme for ``choir verify`` sessions, ``choir run`` runs and rounds, gate
checks and the green threads under each (``{round id}-{verifier}-{replica}``)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime


def new_run_id(prefix: str) -> str:
    """A sortable, unique run id: prefix, UTC time, random suffix."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"{prefix}-{stamp}-{secrets.token_hex(3)}"


def round_run_id(run_id: str, round_no: int) -> str:
    """A ``choir run`` round's id: every green thread of round ``round_no`` is under it."""
    return f"{run_id}-r{round_no}"


def check_run_id(agent_run: str) -> str:
    """A gate check's id: fresh per check, also when a resumed agent run checks again."""
    return f"{agent_run}-check{secrets.token_hex(4)}"


def thread_run_id(round_id: str, verifier: str, replica: int) -> str:
    """A green thread's run id (its run folder's name): the round's id, verifier, replica."""
    return f"{round_id}-{verifier}-{replica}"
