"""Green threads on a distributed engine (Dask distributed): verifiers of one run fan out to
worker processes, possibly on other machines.

``CHOIR_SCHEDULER=tcp://host:8786`` (a Dask scheduler) turns it on for ``choir verify``.
Each verifier runs on a worker, in that worker's sandbox, against the sealed snapshot sent
to it (its blake3 checked before it is unpacked); the worker returns the sealed run folder,
whose every file is hashed again where it lands and must match the worker's manifest. The
report and the attestation are made on the coordinator, by the same code as for a local
green thread. Why Dask and not Ray: docs/distributed.md.
"""

from choir.distributed.fanout import SCHEDULER_ENV, DaskFanout, fanout_from_env

__all__ = ["SCHEDULER_ENV", "DaskFanout", "fanout_from_env"]
