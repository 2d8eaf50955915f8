"""The coordinator's side: send each verifier of a run to the Dask cluster, land the result.

``DaskFanout.run_verifier`` has the signature of
``choir.verification.pipeline.run_verifier``, so the
green thread (``choir.verification.run_verifier_thread``) calls it in place of the local
run and goes on to the same report and attestation. It blocks in the green thread's pool
thread while the worker runs; the snapshot is tarred and hashed once per run and shipped to
the cluster once (workers fetch it from where it lives).
"""

from __future__ import annotations

import io
import os
import tarfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from choir.exceptions import MissingExtraError, UserError

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Target, VerifierSpec
    from choir.sandbox import Sandbox
    from choir.verification.pipeline import PipelineResult

SCHEDULER_ENV = "CHOIR_SCHEDULER"
TIMEOUT_ENV = "CHOIR_SCHEDULER_TIMEOUT_S"  # how long to try to reach it (default 30 s)


def fanout_from_env(options: dict[str, Any] | None = None) -> DaskFanout | None:
    """A fan-out to the scheduler named by ``CHOIR_SCHEDULER``, or None when it is unset.

    Raises:
        UserError: ``CHOIR_SCHEDULER_TIMEOUT_S`` is not a positive number.
    """
    address = os.environ.get(SCHEDULER_ENV)
    if not address:
        return None
    raw = os.environ.get(TIMEOUT_ENV, "30")
    try:
        timeout = float(raw)
        if timeout <= 0:
            raise ValueError(raw)
    except ValueError:
        raise UserError(f"{TIMEOUT_ENV}={raw!r}: give a number of seconds above 0") from None
    return DaskFanout(address, options or {}, timeout_s=timeout)


def pack_snapshot(root: Path) -> bytes:
    """The sealed snapshot as tar bytes (links kept as links, never followed)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for entry in sorted(root.iterdir()):
            tar.add(entry, arcname=entry.name)
    return buf.getvalue()


class DaskFanout:
    """Runs verifiers on a Dask cluster. ``options`` are the sandbox's (``choir.yaml``)."""

    def __init__(self, address: str, options: dict[str, Any], timeout_s: float = 30) -> None:
        self.address = address
        self.options = options
        self.timeout_s = timeout_s
        self._client: Any = None
        self._snapshots: dict[Path, tuple[Any, str]] = {}
        self._lock = threading.Lock()

    def _connect(self) -> Any:
        try:
            from distributed import Client
        except ImportError as exc:
            raise MissingExtraError("fanning out to a cluster needs: "
                                    "pip install 'choir[distributed]'") from exc
        if self._client is None:
            try:
                # What workers send back is loaded as plain data only: a pickle from a
                # compromised worker would run its code here, before any hash is checked.
                self._client = Client(  # type: ignore[no-untyped-call]
                    self.address, timeout=self.timeout_s, set_as_default=False,
                    deserializers=["msgpack"])
            except OSError as exc:
                raise UserError(f"{SCHEDULER_ENV}={self.address}: no Dask scheduler answers "
                                f"({exc}); start one or unset {SCHEDULER_ENV}") from exc
        return self._client

    def _snapshot(self, repo: Path) -> tuple[Any, str]:
        from choir._core.canonical import blake3_hex

        with self._lock:
            client = self._connect()
            if repo not in self._snapshots:
                data = pack_snapshot(repo)
                # on every worker: placement by free threads, not by where the bytes are
                [future] = client.scatter([data], hash=False, broadcast=True)
                self._snapshots[repo] = (future, blake3_hex(data))
            return self._snapshots[repo]

    def run_verifier(self, spec: VerifierSpec, *, repo: Path, sandbox: Sandbox,
                     store: ArtifactStore, run_id: str, target: Target,
                     env: Mapping[str, str] | None = None) -> PipelineResult:
        """Run ``spec`` on a worker and land its sealed run folder in ``store``.

        A run id that already sealed here (a resumed green thread) is returned as stored,
        as ``choir.verification.pipeline.run_verifier`` does, and nothing runs again.

        Raises:
            IntegrityError: what came back does not hash to what the worker sealed.
        """
        from choir.distributed.remote_run import RemoteRun, land
        from choir.exceptions import IntegrityError
        from choir.verification.pipeline import replay_sealed

        replayed = replay_sealed(store, run_id, spec, target)
        if replayed is not None:
            return replayed
        snapshot, snapshot_hash = self._snapshot(repo)
        future = self._client.submit(
            _run_on_worker,
            spec.model_dump_json(), target.model_dump_json(), run_id, snapshot, snapshot_hash,
            sandbox.name, self.options, sandbox.require_limits, dict(env or {}), pure=False,
            key=f"choir-{run_id}")
        try:
            remote = RemoteRun.model_validate(future.result(), strict=True)
        except (TypeError, ValueError) as exc:
            raise IntegrityError(f"run {run_id}: the worker's answer is not a run folder "
                                 f"({str(exc)[:300]})") from None
        return land(remote, store=store, spec=spec, target=target)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
            self._snapshots.clear()


def _run_on_worker(*args: Any) -> dict[str, Any]:
    """Imported on the worker by reference (cloudpickle pickles this module function by name).

    Returns plain data (str, bytes, dict), which msgpack carries back."""
    from choir.distributed.worker import run_on_worker

    return run_on_worker(*args).model_dump()
