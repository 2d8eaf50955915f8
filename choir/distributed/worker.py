"""The worker's side: unpack the snapshot once per worker, run one verifier, send it back.

Runs inside a Dask worker process (imported there by name, so the worker needs Choir
installed). The snapshot arrives as tar bytes with the blake3 the coordinator computed; it is
checked before anything is unpacked, and unpacked with tarfile's ``data`` filter (no absolute
names, no ``..``, no links leaving the tree, no devices). The run happens in a throw-away
artifact store under the worker's local directory, in the sandbox named by the coordinator,
so the manifest records the worker's real sandbox and limits.
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

from choir.distributed.remote_run import RemoteRun

_LOCK = threading.Lock()
_TREES: dict[str, Path] = {}  # snapshot blake3 -> unpacked tree, per worker process


def _local_root() -> Path:
    try:
        from distributed import get_worker

        return Path(get_worker().local_directory)
    except (ImportError, ValueError):  # not inside a worker (a direct call)
        return Path(tempfile.gettempdir())


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
    import socket

    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Target, VerifierSpec
    from choir.sandbox import get_sandbox
    from choir.verification.pipeline import run_verifier

    spec = VerifierSpec.model_validate_json(spec_json)
    target = Target.model_validate_json(target_json)
    repo = _tree(snapshot, snapshot_hash)
    scratch = Path(tempfile.mkdtemp(prefix="choir-run-", dir=_local_root()))
    sandbox = get_sandbox(sandbox_name, **options)
    sandbox.require_limits = require_limits
    try:
        store = ArtifactStore(scratch)
        result = run_verifier(spec, repo=repo, sandbox=sandbox, store=store, run_id=run_id,
                              target=target, env=env)
        base = store.run_dir(run_id)
        files = {rel: (base / rel).read_bytes() for rel in result.manifest.files}
        remote = RemoteRun(run_id=run_id, manifest_json=(base / "manifest.json").read_bytes(),
                           manifest_hash=result.manifest_hash, files=files,
                           worker=f"{socket.gethostname()}:{os.getpid()}")
        return remote
    finally:
        sandbox.close()
        shutil.rmtree(scratch, ignore_errors=True)
