"""The worker's side: unpack the snapshot once per worker, run one verifier, send it back.

Runs inside a Dask worker process (imported there by name, so the worker needs Choir
installed). The snapshot arrives as tar bytes with the blake3 the coordinator computed; it is
checked before anything is unpacked, and unpacked with tarfile's ``data`` filter (no absolute
names, no ``..``, no links leaving the tree, no devices). The run happens in a throw-away
artifact store under the worker's local directory, in the sandbox named by the coordinator,
so the manifest records the worker's real sandbox and limits. The manifest sent back also
names this worker (its certificate's name and fingerprint), and the worker signs the
manifest's hash with its certificate's key: the coordinator checks both against the cluster's
CA, so a result says which worker made it and no worker can speak for another.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

from choir.distributed.pki import CertFiles, identity_of, sign_as
from choir.distributed.remote_run import RemoteRun, signed_bytes
from choir.models import RunManifest

_LOCK = threading.Lock()
_TREES: dict[str, Path] = {}  # snapshot blake3 -> unpacked tree, per worker process


def _local_root() -> Path:
    try:
        from distributed import get_worker

        return Path(get_worker().local_directory)
    except (ImportError, ValueError):  # not inside a worker (a direct call)
        return Path(tempfile.gettempdir())


def _certificate() -> CertFiles:
    """The certificate this worker process shows its peers (``--tls-cert``/``--tls-key``).

    Raises:
        IntegrityError: not a worker of a TLS cluster: it has no identity to sign with.
    """
    from distributed import get_worker

    from choir.exceptions import IntegrityError

    security = get_worker().security
    cert = getattr(security, "tls_worker_cert", None)
    key = getattr(security, "tls_worker_key", None)
    if not cert or not key or "\n" in cert:
        raise IntegrityError("this Dask worker has no certificate file of Choir's cluster CA")
    return CertFiles(Path(cert), Path(key))


def seal_for_coordinator(run_id: str, manifest: RunManifest, files: dict[str, bytes],
                         certificate: CertFiles) -> RemoteRun:
    """The run as sent back: its manifest naming this worker, signed with its key."""
    from choir._core.canonical import blake3_hex, canonical_json

    name, fingerprint = identity_of(certificate.cert.read_bytes())
    named = manifest.model_copy(update={"platform": manifest.platform.model_copy(
        update={"worker": name, "worker_cert": fingerprint})})
    manifest_json = canonical_json(named)
    manifest_hash = blake3_hex(manifest_json)
    cert_pem, signature = sign_as(certificate, signed_bytes(run_id, manifest_hash))
    return RemoteRun(run_id=run_id, manifest_json=manifest_json, manifest_hash=manifest_hash,
                     files=files, worker_cert=cert_pem, signature=signature)


def _tree(snapshot: bytes, snapshot_hash: str) -> Path:
    from choir._core.canonical import blake3_hex
    from choir.exceptions import IntegrityError

    with _LOCK:
        if snapshot_hash in _TREES:
            return _TREES[snapshot_hash]
        if blake3_hex(snapshot) != snapshot_hash:
            raise IntegrityError("the snapshot does not hash to what the coordinator sent")
        root = Path(tempfile.mkdtemp(prefix="choir-tree-", dir=_local_root()))
        with tarfile.open(fileobj=io.BytesIO(snapshot)) as tar:
            tar.extractall(root, filter="data")
        os.chmod(root, 0o755)
        _TREES[snapshot_hash] = root
        return root


def run_on_worker(spec_json: str, target_json: str, run_id: str, snapshot: bytes,
                  snapshot_hash: str, sandbox_name: str, options: dict[str, Any],
                  require_limits: bool, env: dict[str, str] | None = None) -> RemoteRun:
    """Run one verifier here; returns its sealed run folder as a ``RemoteRun``."""
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Target, VerifierSpec
    from choir.sandbox import get_sandbox
    from choir.verification.pipeline import run_verifier

    spec = VerifierSpec.model_validate_json(spec_json)
    target = Target.model_validate_json(target_json)
    certificate = _certificate()
    repo = _tree(snapshot, snapshot_hash)
    scratch = Path(tempfile.mkdtemp(prefix="choir-run-", dir=_local_root()))
    sandbox = get_sandbox(sandbox_name, **options)
    sandbox.require_limits = require_limits
    try:
        store = ArtifactStore(scratch)
        result = run_verifier(spec, repo=repo, sandbox=sandbox, store=store, run_id=run_id,
                              target=target, env=env)
        # the stored objects, not the run folder: a process the step left behind may have
        # swapped links in there since it was sealed
        files = {rel: store.read_bytes(digest) for rel, digest in result.manifest.files.items()}
        return seal_for_coordinator(run_id, result.manifest, files, certificate)
    finally:
        sandbox.close()
        shutil.rmtree(scratch, ignore_errors=True)
