"""The run manifest (docs/concepts.md), extended with the hash of every file in the run folder."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from pydantic import Field

from choir.models._base import Frozen


class AppliedLimits(Frozen):
    """The limits a backend actually enforced on a step: the value, or None when it was not.

    Not what the policy asked for: a bwrap step where the cgroup controllers are not writable
    records ``memory_mb``/``pids`` as None, a ``local`` step records only the ``out_mb`` cap.
    Every field is always written (None as ``null``), so "not enforced" is explicit.
    """

    memory_mb: int | None = None
    pids: int | None = None
    cpus: float | None = None
    out_mb: int | None = None  # $CHOIR_OUT cap (RLIMIT_FSIZE per file plus the watchdog)

    @staticmethod
    def weakest(steps: Sequence[AppliedLimits | None]) -> AppliedLimits | None:
        """What held for every step: a field keeps its value only if each step had it.

        None when no step ran (nothing was enforced on anything).
        """
        if not steps:
            return None
        fields: dict[str, object] = {}
        for name in AppliedLimits.model_fields:
            values = {getattr(s, name) if s is not None else None for s in steps}
            fields[name] = values.pop() if len(values) == 1 else None
        return AppliedLimits.model_validate(fields)


def _absent(value: object) -> bool:
    return value is None


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
    # the limits enforced on this step; left out of the JSON when absent (manifests written
    # before it existed keep their hashes)
    limits_applied: AppliedLimits | None = Field(default=None, exclude_if=_absent)
    # bytes of the step's output not stored: its log was cut at ``limits.out_mb`` (absent:
    # stored whole)
    output_cut: int | None = Field(default=None, exclude_if=_absent)


class Interpreter(Frozen):
    """The interpreter a verifier's steps ran, as evidence (``choir.sandbox._interpreter``).

    An interpreter inside the repo (the repo's ``.venv``, ignored or not) is outside the tree
    hash, yet the steps run it: an executor that planted a ``.pth`` or a fake ``pytest``
    there made a buggy tree PASS. Its whole folder is hashed, and it runs only when that
    digest is the one trusted (``trust``); one outside the repo is recorded by the files
    it reads at start-up (the binary, ``pyvenv.cfg``, ``.pth`` files, ``sitecustomize``).
    """

    python: str  # the interpreter a step's ``python3`` resolves to
    venv: str | None = None
    digest: str  # blake3 of the hashed files' paths, kinds, modes and contents
    files: int
    scope: Literal["tree", "startup"]  # the whole folder, or the start-up files only
    in_repo: bool = False
    # outside-repo: not the executor's to change; trusted: the digest recorded when it was
    # trusted (``choir trust-interpreter``); first-use: no digest was recorded yet, this one is
    trust: Literal["outside-repo", "trusted", "first-use"]


class Platform(Frozen):
    os: str
    arch: str
    container_image: str | None = None
    image_digest: str | None = None
    sandbox: str
    isolation: Literal["container", "namespace", "none"]
    # docker: how the repo and output reached the engine (bind mounts, or copied through the
    # API for a remote engine); absent for other backends and in older manifests
    transfer: Literal["bind", "copy"] | None = Field(default=None, exclude_if=_absent)
    # what held for every step that ran (``AppliedLimits.weakest``); absent when none ran
    limits_applied: AppliedLimits | None = Field(default=None, exclude_if=_absent)
    # a run on a Dask worker: the name and sha256 fingerprint of the worker's certificate,
    # checked by the coordinator against the cluster's CA and the worker's signature
    worker: str | None = Field(default=None, exclude_if=_absent)
    worker_cert: str | None = Field(default=None, exclude_if=_absent)
    # the interpreter the steps ran (absent: the image's own, or a backend that chose none)
    interpreter: Interpreter | None = Field(default=None, exclude_if=_absent)
    # the host folders bound into the sandbox (``sandbox.binds`` and resource folders,
    # resolved); absent when none, so manifests written before it keep their hashes
    binds: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)


class RunManifest(Frozen):
    """The run folder's fields plus ``files``: relative path in the run folder -> blake3 hex.

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
