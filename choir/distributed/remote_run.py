"""What a worker sends back for one verifier run, and how the coordinator lands it.

The worker is trusted to run the step, not to tell the truth about bytes in transit: every
file is hashed again on arrival and must match the manifest the worker sealed, the manifest
must name this verifier, tree and run, and nothing may arrive that the manifest does not list.
Who sent it is checked too: the worker signs ``signed_bytes`` (the run id and the manifest's
hash) with its certificate's key, and the manifest must name that certificate
(``platform.worker``, ``platform.worker_cert``). Anything else is an ``IntegrityError``: no
report, no attestation (fail-closed).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from pydantic import Field

from choir._core.canonical import blake3_hex as hash_bytes
from choir.exceptions import IntegrityError
from choir.models import RunManifest, Target, VerifierSpec
from choir.models._base import Frozen

if TYPE_CHECKING:
    from choir.distributed.pki import Identity
    from choir.evidence.artifacts import ArtifactStore
    from choir.verification.pipeline import PipelineResult


class RemoteRun(Frozen):
    """A sealed run folder in transit: the manifest as the worker wrote it, and its files."""

    run_id: str
    manifest_json: bytes
    manifest_hash: str
    files: dict[str, bytes] = Field(default_factory=dict)
    worker_cert: bytes = b""  # the worker's certificate (PEM), checked against the CA
    signature: bytes = b""  # of ``signed_bytes(run_id, manifest_hash)`` by that certificate


def signed_bytes(run_id: str, manifest_hash: str) -> bytes:
    """What a worker signs for one run: a result stands for this run and manifest only."""
    return f"choir/worker-run/v1\n{run_id}\n{manifest_hash}\n".encode()


def _clean(rel: str) -> PurePosixPath:
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts or rel == "manifest.json":
        raise IntegrityError(f"a returned run holds a file named {rel!r}")
    return path


def most_returned_bytes(spec: VerifierSpec) -> int:
    """The most bytes of files a run of ``spec`` may return: ``$CHOIR_OUT`` and the logs
    are each capped at ``out_mb`` (a one-step run's log is stored twice, as its step's and
    as the combined log), and a MiB besides."""
    return (3 * spec.limits.out_mb << 20) + (1 << 20)


def _within_limits(remote: RemoteRun, spec: VerifierSpec) -> None:
    """Refuse a run larger than the verifier's limits let a step make
    (``most_returned_bytes``, and ``out_files`` files besides the logs). A worker that
    returned more is not the one that ran the step honestly (review 16, F3: 64 MiB against
    ``out_mb: 1`` was stored and attested). The coordinator bounds what it reads of an
    answer before this (``choir.distributed.fanout``, review 23c F2)."""
    limits = spec.limits
    most = most_returned_bytes(spec)
    size = sum(len(data) for data in remote.files.values())
    if size > most or len(remote.files) > limits.out_files + len(spec.steps) + 2:
        raise IntegrityError(f"run {remote.run_id}: the worker returned {len(remote.files)} "
                             f"files of {size} bytes, more than limits.out_mb "
                             f"({limits.out_mb} MiB) and limits.out_files ({limits.out_files})"
                             " let a step make")


def land(remote: RemoteRun, *, store: ArtifactStore, spec: VerifierSpec,
         target: Target, worker: Identity | None = None,
         run_id: str | None = None) -> PipelineResult:
    """Store ``remote`` under its run id, re-hash everything, and return the stored result.

    ``worker``: who signed it (``ClusterPKI.verify_signed``); the manifest must name it.
    ``run_id``: the run asked for; an answer for another (a sibling replica's, whose id it
    would take: review 23c F3) is refused before anything is stored.

    Raises:
        IntegrityError: a byte, a name or the manifest does not match (see module docstring).
    """
    from choir.verification.pipeline import ran_spec_steps, stored_result

    if run_id is not None and remote.run_id != run_id:
        raise IntegrityError(f"run {run_id}: the worker answered for run {remote.run_id[:80]!r},"
                             " not the run asked for")
    try:
        manifest = RunManifest.model_validate_json(remote.manifest_json)
    except ValueError as exc:
        raise IntegrityError(f"run {remote.run_id}: the returned manifest does not parse: "
                             f"{exc}") from None
    if hash_bytes(remote.manifest_json) != remote.manifest_hash:
        raise IntegrityError(f"run {remote.run_id}: the returned manifest does not hash to "
                             f"{remote.manifest_hash}")
    if (manifest.run_id, manifest.verifier, manifest.tree_hash) != (
            remote.run_id, spec.name, target.tree_hash):
        raise IntegrityError(f"run {remote.run_id}: the worker returned a manifest of "
                             f"{manifest.run_id} ({manifest.verifier} on "
                             f"{manifest.tree_hash[:12]})")
    named = (manifest.platform.worker, manifest.platform.worker_cert)
    if worker is not None and named != (worker.name, worker.fingerprint):
        raise IntegrityError(f"run {remote.run_id}: the manifest names worker {named[0]!r}, "
                             f"but {worker.name!r} signed it")
    if not ran_spec_steps(manifest, spec):
        raise IntegrityError(f"run {remote.run_id}: the worker's manifest records other steps "
                             f"than {spec.name}'s")
    if set(remote.files) != set(manifest.files):
        raise IntegrityError(f"run {remote.run_id}: the returned files are not those the "
                             "manifest lists")
    _within_limits(remote, spec)
    folders = {str(parent) for rel in remote.files for parent in _clean(rel).parents}
    clash = sorted(set(remote.files) & folders)
    if clash:  # a file and a folder of the same name: nothing is written half-way
        raise IntegrityError(f"run {remote.run_id}: {clash[0]!r} is returned both as a file "
                             "and as a folder")
    for rel, data in remote.files.items():
        if hash_bytes(data) != manifest.files[rel]:
            raise IntegrityError(f"run {remote.run_id}: {rel} does not hash to "
                                 f"{manifest.files[rel]} where it landed")
    sealed = store.sealed(remote.run_id)
    if sealed is not None:
        if sealed[1] != remote.manifest_hash:
            raise IntegrityError(f"run id {remote.run_id} already names another run")
        return stored_result(store, remote.run_id, *sealed)
    store.set_aside(remote.run_id)
    base = store.run_dir(remote.run_id)
    base.mkdir(parents=True)
    for rel, data in remote.files.items():
        path = base / Path(*_clean(rel).parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if store.seal_run(remote.run_id) != dict(manifest.files):  # hashed again, as stored
        raise IntegrityError(f"run {remote.run_id}: the stored files differ from the manifest")
    manifest_hash = store.write_manifest(remote.run_id, manifest)
    if manifest_hash != remote.manifest_hash:
        raise IntegrityError(f"run {remote.run_id}: the manifest is not canonical")
    return stored_result(store, remote.run_id, manifest, manifest_hash)
