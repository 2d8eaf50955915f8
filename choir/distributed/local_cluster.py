"""A real Dask cluster on this machine: one scheduler and N worker processes, on loopback.

For tests and the benchmark (``bench/distributed_fanout.py``), and for trying the fan-out
without other machines. Each process is a ``dask scheduler`` / ``dask worker`` command, as
an operator would start them on separate hosts; everything they write stays under ``root``,
and ``close`` stops exactly the processes started here.
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


class LocalCluster:
    """``with LocalCluster(root, workers=2, threads=4) as cluster: cluster.address``."""

    def __init__(self, root: Path, *, workers: int = 2, threads: int = 4,
                 timeout_s: float = 60) -> None:
        self.root = root
        self.workers = workers
        self.threads = threads
        self.timeout_s = timeout_s
        self.address = ""
        self.worker_dirs: list[Path] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it
        env = {**os.environ, "TMPDIR": str(self.root), "DASK_DISTRIBUTED__WORKER__DAEMON":
               "False"}
        try:
            self._procs.append(subprocess.Popen(
                [sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
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
        info = self.root / "scheduler.json"
        self._spawn("scheduler", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                    "--port", "0", "--no-dashboard", "--scheduler-file", str(info))
        deadline = time.monotonic() + self.timeout_s
        while not info.exists() or not info.read_text().strip():
            self._check(deadline)
        self.address = json.loads(info.read_text())["address"]
        for i in range(self.workers):
            local = self.root / f"worker-{i}"
            local.mkdir(exist_ok=True)
            self.worker_dirs.append(local)
            self._spawn(f"worker-{i}", "distributed.cli.dask_worker", self.address,
                        "--host", "127.0.0.1", "--nthreads", str(self.threads),
                        "--no-dashboard", "--local-directory", str(local),
                        "--name", f"w{i}")
        from distributed import Client

        client = Client(self.address, timeout=self.timeout_s,  # type: ignore[no-untyped-call]
                        set_as_default=False)
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
