"""8 verifiers over 2 local Dask workers finish in about the time of the slowest.

    python bench/distributed_fanout.py [--sandbox bwrap|docker|local] [--rounds 3]

Starts a real cluster (a scheduler and two worker processes, 4 threads each, on loopback:
``choir.distributed.local_cluster``), then runs ``choir verify`` (``verify_tree``) on a repo
of 8 verifiers ``sleep N`` with N = 1.0, 1.5, ..., 4.5 s, fanned out through
``CHOIR_SCHEDULER``. Reported: cluster start-up, each round's wall time against the slowest
verifier (4.5 s), the overhead above it, and the same 8 verifiers as local green threads
(no cluster) for comparison. Every round must PASS with 8 attestations.

Then what mutual TLS and signed results cost per verifier (``--tls-tasks N``, default 200,
0 to skip), against the bare equivalent in the same run: one task round trip carrying a
64 KiB result on two Dask clusters started alike (``distributed.LocalCluster``, 1 worker
process), one plain ``tcp://``, one ``tls://`` with Choir's certificates; and the worker's
signature plus the coordinator's certificate and signature check
(``seal_for_coordinator``, ``ClusterPKI.verify_signed``) on a real run manifest.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SLEEPS = [1.0 + 0.5 * i for i in range(8)]


def make_repo(root: Path, sandbox: str) -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / "data.txt").write_text("bench\n")
    lines = [f"sandbox: {{backend: {sandbox}}}", "max_parallel: 8", "verifiers:"]
    for i, seconds in enumerate(SLEEPS):
        lines += [f"  sleep{i}:", "    kind: smoke",
                  f"    steps: [{{name: s, command: 'sleep {seconds}'}}]"]
    (repo / "choir.yaml").write_text("\n".join(lines) + "\n")
    return repo


def one_round(repo: Path, sandbox: str) -> float:
    from choir.app.verify import verify_tree
    from choir.models import Mood

    start = time.perf_counter()
    outcome = verify_tree(repo, mood=Mood.SKEPTICAL, sandbox_name=sandbox)
    took = time.perf_counter() - start
    assert outcome.passed and len(outcome.contract["attestations"]) == 8, outcome.contract
    return took


def _payload(i: int) -> bytes:
    return bytes(64 * 1024)


def round_trips(tasks: int, security: object | None) -> list[float]:
    """Seconds per task round trip (submit, run, result) on a fresh one-worker cluster."""
    from distributed import Client
    from distributed import LocalCluster as DaskCluster

    kind = {"protocol": "tls://", "security": security} if security else {"protocol": "tcp://"}
    with DaskCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                     dashboard_address=None, **kind) as cluster, \
            Client(cluster, security=security) as client:
        client.submit(_payload, -1, pure=False).result()  # warm: imports, connections
        took = []
        for i in range(tasks):
            start = time.perf_counter()
            client.submit(_payload, i, pure=False).result()
            took.append(time.perf_counter() - start)
    return took


def signing_cost(root: Path, tasks: int) -> list[float]:
    """Seconds per result for the worker's signature and the coordinator's check of it."""
    from choir.app.verify import resolve_target
    from choir.distributed.pki import ClusterPKI
    from choir.distributed.remote_run import signed_bytes
    from choir.distributed.worker import seal_for_coordinator
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import StepSpec, VerifierKind, VerifierSpec
    from choir.sandbox import get_sandbox
    from choir.verification.pipeline import run_verifier

    pki = ClusterPKI(root / "sign-certs")
    cert = pki.issue("worker", "w0")
    repo = root / "repo"
    spec = VerifierSpec(name="v", kind=VerifierKind.SMOKE,
                        steps=(StepSpec(name="s", command="echo hi > $CHOIR_OUT/x"),))
    store = ArtifactStore(root / "sign-store")
    result = run_verifier(spec, repo=repo, sandbox=get_sandbox("local"), store=store,
                          run_id="r", target=resolve_target(repo))
    files = {rel: (result.run_dir / rel).read_bytes() for rel in result.manifest.files}
    took = []
    for _ in range(tasks):
        start = time.perf_counter()
        remote = seal_for_coordinator("r", result.manifest, files, cert)
        pki.verify_signed(remote.worker_cert, remote.signature,
                          signed_bytes("r", remote.manifest_hash), "worker")
        took.append(time.perf_counter() - start)
    return took


def tls_overhead(root: Path, tasks: int) -> None:
    from distributed.security import Security

    from choir.distributed.pki import ClusterPKI

    pki = ClusterPKI(root / "tls-certs")
    sched, worker, client = (pki.issue("scheduler", "s"), pki.issue("worker", "w"),
                             pki.issue("client", "c"))
    security = Security(require_encryption=True, tls_ca_file=str(pki.ca_file),
                        tls_scheduler_cert=str(sched.cert), tls_scheduler_key=str(sched.key),
                        tls_worker_cert=str(worker.cert), tls_worker_key=str(worker.key),
                        tls_client_cert=str(client.cert), tls_client_key=str(client.key))
    took: dict[str, list[float]] = {"tcp": [], "tls": []}
    for _ in range(2):  # interleaved, so drifting load hits both alike
        took["tcp"] += round_trips(tasks, None)
        took["tls"] += round_trips(tasks, security)
    ms = {name: 1000 * statistics.median(values) for name, values in took.items()}
    sign = 1000 * statistics.median(signing_cost(root, tasks))
    bare = ms["tcp"]
    print(f"task round trip, 64 KiB result, median of 2 x {tasks}: tcp {bare:.2f} ms, "
          f"tls {ms['tls']:.2f} ms (tls/tcp {ms['tls'] / bare:.2f}x, "
          f"{ms['tls'] - bare:+.2f} ms)")
    print(f"worker signature + coordinator check per result: {sign:.2f} ms")
    print(f"TLS and signed results per verifier: about {ms['tls'] - bare + sign:+.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tls-tasks", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="choir-bench-dist-"))
    try:
        run(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, args: argparse.Namespace) -> None:
    os.environ["CHOIR_HOME"] = str(root / "home")
    os.environ["CHOIR_ARTIFACT_DIR"] = str(root / "home" / "artifacts")
    from choir.distributed.local_cluster import LocalCluster

    repo = make_repo(root, args.sandbox)
    slowest = max(SLEEPS)
    print(f"8 verifiers: sleep {', '.join(f'{s:g}' for s in SLEEPS)} s "
          f"(slowest {slowest:g} s, sum {sum(SLEEPS):g} s); sandbox {args.sandbox}")
    os.environ.pop("CHOIR_SCHEDULER", None)
    local = [one_round(repo, args.sandbox) for _ in range(args.rounds)]
    print(f"local green threads:      median {statistics.median(local):.2f} s  "
          f"(rounds: {', '.join(f'{t:.2f}' for t in local)})")
    start = time.perf_counter()
    with LocalCluster(root / "cluster", workers=2, threads=4) as cluster:
        up = time.perf_counter() - start
        print(f"TLS cluster up (scheduler + 2 worker processes): {up:.2f} s")
        os.environ["CHOIR_SCHEDULER"] = cluster.address
        dist = [one_round(repo, args.sandbox) for _ in range(args.rounds)]
    med = statistics.median(dist)
    print(f"2 Dask workers x 4 threads: median {med:.2f} s  "
          f"(rounds: {', '.join(f'{t:.2f}' for t in dist)})")
    print(f"overhead above the slowest verifier: {med - slowest:.2f} s "
          f"({med / slowest:.2f}x the slowest; one after another would be {sum(SLEEPS):g} s)")
    if args.tls_tasks:
        tls_overhead(root, args.tls_tasks)


if __name__ == "__main__":
    main()
