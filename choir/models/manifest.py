"""The seed-001 run manifest, extended with the hash of every file in the run folder."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from choir.models._base import Frozen


class CommandRecord(Frozen):
    """One executed step."""

    name: str
    command: str
    exit_code: int
    duration_ms: int
    timed_out: bool = False
    oom_killed: bool = False
    # which enforced limit stopped the step (e.g. the $CHOIR_OUT cap), when one did
    limit_exceeded: str | None = None


class Platform(Frozen):
    os: str
    arch: str
    container_image: str | None = None
    image_digest: str | None = None
    sandbox: str
    isolation: Literal["container", "namespace", "none"]


class RunManifest(Frozen):
    """Seed 001 fields plus ``files``: relative path in the run folder -> blake3 hex.

    The manifest's own hash is signed into the attestation, and every other file in the run
    folder is listed here, so no byte of a run folder can change unnoticed.
    """

    schema_version: Literal[1] = 1
    run_id: str
    verifier: str
    status: Literal["PASS", "FAIL", "INCONCLUSIVE"]
    timestamp_start: datetime
    timestamp_end: datetime
    commit_sha: str | None = None
    tree_hash: str
    commands_executed: tuple[CommandRecord, ...] = ()
    platform: Platform
    infra_error: str | None = Field(default=None, max_length=1000)
    files: dict[str, str] = Field(default_factory=dict)
    bytes_logged: int = 0
