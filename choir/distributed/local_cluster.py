"""A real Dask cluster on this machine: one scheduler and N worker processes, TLS on loopback.

For tests and the benchmark (``bench/distributed_fanout.py``), and for trying the fan-out
without other machines. Each process is a ``dask scheduler`` / ``dask worker`` command, as
an operator would start them on separate hosts (``cluster_commands`` builds them), with the
certificates of ``$CHOIR_HOME/dask`` (``choir.distributed.pki``): every connection is mutual
TLS 1.3, each operation answers only the roles it belongs to (``choir.distributed.guard``),
and every listener is bound to ``host`` (127.0.0.1 unless given), the HTTP servers
Dask always starts included, with no routes behind them (no dashboard, no metrics, no
proxy). Everything they write stays under ``root``, and ``close`` stops exactly the
processes started here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from choir.distributed.pki import ClusterPKI

# Dask's settings for every process of the cluster (environment: read before anything runs)
DASK_ENV = {
    "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",  # a tcp:// peer is refused
    "DASK_DISTRIBUTED__COMM__TLS__MIN_VERSION": "1.3",
    "DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES": "[]",  # its HTTP server serves nothing
    "DASK_DISTRIBUTED__WORKER__HTTP__ROUTES": "[]",
    "DASK_DISTRIBUTED__WORKER__DAEMON": "False",  # the sandboxes' own processes may fork
}


GUARD = "choir.distributed.guard"  # who may ask for what: a preload in every process


def scheduler_command(pki: ClusterPKI, *, host: str, port: int = 0,
                      info: Path | None = None) -> list[str]:
    """``dask scheduler`` on ``tls://host:port`` with this CA's scheduler certificate."""
    files = pki.issue("scheduler", "scheduler")
    command = ["distributed.cli.dask_scheduler", "--protocol", "tls", "--host", host,
               "--port", str(port), "--no-dashboard", "--dashboard-address", f"{host}:0",
               "--tls-ca-file", str(pki.ca_file), "--tls-cert", str(files.cert),
               "--tls-key", str(files.key), "--preload", GUARD]
    return command + (["--scheduler-file", str(info)] if info else [])


def worker_command(pki: ClusterPKI, address: str, *, name: str, host: str, threads: int,
                   local: Path) -> list[str]:
    """``dask worker`` ``name`` connecting to ``address``, with the certificate of that name
    (the scheduler's guard admits a worker under its certificate's name only)."""
    files = pki.issue("worker", name)
    return ["distributed.cli.dask_worker", address, "--protocol", "tls", "--host", host,
            "--nthreads", str(threads), "--no-dashboard", "--dashboard-address", f"{host}:0",
            "--local-directory", str(local), "--name", name,
            "--tls-ca-file", str(pki.ca_file), "--tls-cert", str(files.cert),
            "--tls-key", str(files.key), "--preload", GUARD, "--preload-nanny", GUARD]


class LocalCluster:
    """``with LocalCluster(root, workers=2, threads=4) as cluster: cluster.address``.

    The workers are named ``w0``, ``w1``, ... as their certificates. ``pki``: the CA (default
    ``choir.distributed.pki.ClusterPKI.configured()``, made when missing).
    """

    def __init__(self, root: Path, *, workers: int = 2, threads: int = 4,
                 timeout_s: float = 60, host: str = "127.0.0.1",
                 pki: ClusterPKI | None = None) -> None:
        self.root = root
        self.workers = workers
        self.names = [f"w{i}" for i in range(workers)]
        self.threads = threads
        self.timeout_s = timeout_s
        self.host = host
        self.pki = pki or ClusterPKI.configured()
        self.address = ""
        self.worker_dirs: list[Path] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it
        # CHOIR_HOME is inherited: a worker never signs, but its sandboxes refuse binds that
        # would expose that home (the same machine, the same user: see docs/distributed.md)
        env = {**os.environ, "TMPDIR": str(self.root), **DASK_ENV}
        try:
            self._procs.append(subprocess.Popen(
                [sys.executable, "-P", "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True))
        finally:
            log.close()

    def start(self) -> LocalCluster:
        """Start the scheduler, then the workers; returns when all workers are connected.

        Raises:
            RuntimeError: a process died or the cluster was not up within ``timeout_s``
                (the logs' tails are in the message).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self.pki.ensure()
        info = self.root / "scheduler.json"
        self._spawn("scheduler", scheduler_command(self.pki, host=self.host, info=info))
        deadline = time.monotonic() + self.timeout_s
        while not info.exists() or not info.read_text().strip():
            self._check(deadline)
        self.address = json.loads(info.read_text())["address"]
        for i, name in enumerate(self.names):
            local = self.root / f"worker-{i}"
            local.mkdir(exist_ok=True)
            self.worker_dirs.append(local)
            self._spawn(f"worker-{i}", worker_command(self.pki, self.address, name=name,
                                                      host=self.host, threads=self.threads,
                                                      local=local))
        from distributed import Client

        client = Client(self.address, timeout=self.timeout_s,  # type: ignore[no-untyped-call]
                        set_as_default=False, security=self.pki.client_security())
        try:
            while len(client.scheduler_info(n_workers=-1)["workers"]) < self.workers:
                self._check(deadline)
        finally:
            client.close()  # type: ignore[no-untyped-call]
        return self

    def _check(self, deadline: float) -> None:
        dead = [p for p in self._procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            self.close()
            tails = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}"
                              for log in sorted(self.root.glob("*.log")))
            raise RuntimeError(f"the local Dask cluster did not start:\n{tails}")
        time.sleep(0.1)

    def close(self) -> None:
        """Stop the workers, then the scheduler (SIGTERM, then SIGKILL after 10 s)."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
