"""Who may talk to Choir's Dask cluster, and who made a result: attacks by a local process.

A real cluster (``choir.distributed.local_cluster``: a scheduler and worker processes, mutual
TLS with Choir's CA) and a real rogue: another client that connects to the scheduler and runs
code on the workers. On a cluster without TLS (before this) it patched the workers' verifier
runner so that a failing verifier returned a well-sealed PASS, which the coordinator landed,
re-hashed (every hash matched: the worker itself sealed the lie) and attested; the same
payload read the home's signing key on every worker.
"""

from __future__ import annotations

import socket
import ssl
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed", reason="the distributed extra is not installed: "
                    "pip install 'choir[distributed]'")

from choir.distributed.local_cluster import LocalCluster  # noqa: E402
from choir.distributed.pki import ClusterPKI  # noqa: E402
from tests import dask_cluster as _dask  # noqa: E402

cluster, dask_cluster = _dask.cluster, _dask.dask_cluster  # the fixtures

pytestmark = pytest.mark.bwrap

FAILING = textwrap.dedent("""\
    verifiers:
      unit:
        kind: smoke
        steps:
          - name: run
            command: echo the tree is broken; exit 3
    """)
PASSING = FAILING.replace("echo the tree is broken; exit 3", "echo fine")


def _forge() -> Callable[[], str]:
    """The rogue's payload, run in every worker process (a closure: pickled by value)."""

    def lie() -> str:
        import os

        import choir.verification.pipeline as pipeline

        honest = pipeline.run_verifier

        def lying(spec, *, sandbox, **kw):  # type: ignore[no-untyped-def]
            real = sandbox.exec
            sandbox.exec = lambda command, **k: real("echo all good", **k)
            return honest(spec, sandbox=sandbox, **kw)

        pipeline.run_verifier = lying
        key = Path(os.environ.get("CHOIR_HOME", "/nonexistent")) / "keys" / "ed25519.key"
        return key.read_text() if key.exists() else ""

    return lie


def _rogue(address: str, security: Any) -> str:
    """Connect as ``security`` and plant the forger; "refused" or what the workers said."""
    from distributed import Client

    try:
        rogue = Client(address, timeout=3, set_as_default=False,  # type: ignore[no-untyped-call]
                       security=security)
    except (OSError, TypeError, ValueError) as exc:
        return f"refused: {type(exc).__name__}"
    try:
        return f"ran on the workers: {rogue.run(_forge())}"
    finally:
        rogue.close()  # type: ignore[no-untyped-call]


def _repo(tmp_path: Path, text: str) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(text)
    return repo


def test_a_rogue_client_cannot_forge_a_pass(cluster: LocalCluster, tmp_path: Path) -> None:
    from distributed import Client
    from distributed.security import Security

    from choir.app.verify import verify_tree
    from choir.models import Mood

    host_port = cluster.address.removeprefix("tls://")
    attempts = {
        "plain tcp": _rogue(f"tcp://{host_port}", None),
        "self-signed": _rogue(cluster.address, Security.temporary()),  # another CA
        "another Choir CA": _rogue(cluster.address,
                                   ClusterPKI(tmp_path / "other").ensure().client_security()),
    }
    assert all(v.startswith("refused") for v in attempts.values()), attempts
    outcome = verify_tree(_repo(tmp_path, FAILING), mood=Mood.SKEPTICAL, sandbox_name="bwrap")
    assert outcome.status == "FAIL", "a forged PASS was attested"
    # control: the cluster answers a client with its own CA's certificate
    with Client(cluster.address, timeout=10, set_as_default=False,  # type: ignore[no-untyped-call]
                security=cluster.pki.client_security()) as own:
        assert sorted(own.run(lambda: 1).values()) == [1, 1]


def _handshake(address: str, context: ssl.SSLContext) -> bytes:
    """Open TLS to ``address`` and read what the Dask server says first (b"" if it hangs up)."""
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw) as tls:
        try:
            tls.sendall(b"\0" * 8)
            return tls.recv(64)
        except (ssl.SSLError, ConnectionError):
            return b""


def test_a_connection_without_a_client_certificate_is_refused(cluster: LocalCluster) -> None:
    bare = ssl.create_default_context(cafile=str(cluster.pki.ca_file))
    bare.check_hostname = False  # the server is the real one: only the client lacks a cert
    assert _handshake(cluster.address, bare) == b""
    own = ssl.create_default_context(cafile=str(cluster.pki.ca_file))
    own.check_hostname = False
    files = cluster.pki.issue("client", "coordinator")
    own.load_cert_chain(files.cert, files.key)
    assert _handshake(cluster.address, own) != b""  # control: with a certificate it talks


def test_choir_refuses_a_plain_tcp_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    from choir.distributed import fanout_from_env
    from choir.exceptions import UserError

    monkeypatch.setenv("CHOIR_SCHEDULER", "tcp://127.0.0.1:8786")
    with pytest.raises(UserError, match="tls://"):
        fanout_from_env()


def test_every_listener_is_on_loopback(cluster: LocalCluster) -> None:
    import psutil

    processes = [psutil.Process(pid) for pid in cluster.pids]
    processes += [child for p in list(processes) for child in p.children(recursive=True)]
    listening = [(p.pid, c.laddr) for p in processes for c in p.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    # the scheduler, two nannies, two workers; the HTTP servers Dask starts in any case
    assert len(listening) >= 5, listening
    assert all(addr.ip == "127.0.0.1" for _, addr in listening), listening


def test_each_result_names_the_worker_that_signed_it(cluster: LocalCluster,
                                                     tmp_path: Path) -> None:
    from choir.app.verify import verify_tree
    from choir.distributed.pki import identity_of
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Mood
    from choir.verification import load_manifest

    outcome = verify_tree(_repo(tmp_path, PASSING), mood=Mood.SKEPTICAL, sandbox_name="bwrap")
    assert outcome.passed
    [run] = outcome.contract["threads"]
    platform = load_manifest(ArtifactStore(),
                             outcome.contract["manifest"]["runs"][run["run_id"]]).platform
    certs = {identity_of(cluster.pki.files("worker", n).cert.read_bytes()) for n in ("w0", "w1")}
    assert (platform.worker, platform.worker_cert) in certs


def test_paranoid_reruns_land_on_distinct_workers(cluster: LocalCluster,
                                                  tmp_path: Path) -> None:
    from choir.app.verify import verify_tree
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Mood
    from choir.verification import load_manifest

    outcome = verify_tree(_repo(tmp_path, PASSING), mood=Mood.PARANOID, sandbox_name="bwrap")
    assert outcome.passed, outcome.contract["summary"]
    runs = outcome.contract["manifest"]["runs"]
    workers = [load_manifest(ArtifactStore(), runs[t["run_id"]]).platform.worker
               for t in outcome.contract["threads"] if t["verifier"] == "unit"]
    assert sorted(workers) == ["w0", "w1"]  # two replicas, one on each worker


def _replicas(fanout: Any, repo: Path, n: int) -> list[Any]:
    """Run the verifier of ``repo`` ``n`` times as replicas of one run (distinct run ids)."""
    from concurrent.futures import ThreadPoolExecutor

    from choir.evidence.artifacts import ArtifactStore
    from choir.evidence.target import resolve_target
    from choir.models import StepSpec, VerifierKind, VerifierSpec
    from choir.sandbox import get_sandbox

    spec = VerifierSpec(name="unit", kind=VerifierKind.SMOKE,
                        steps=(StepSpec(name="run", command="echo fine"),))
    target, sandbox, store = resolve_target(repo), get_sandbox("bwrap"), ArtifactStore()

    def one(i: int) -> Any:
        try:
            return fanout.run_verifier(spec, repo=repo, sandbox=sandbox, store=store,
                                       run_id=f"rep-{i}", target=target)
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            return exc

    try:
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(one, range(n)))
    finally:
        sandbox.close()
        fanout.close()


def test_more_independent_reruns_than_workers_is_refused(cluster: LocalCluster,
                                                         tmp_path: Path) -> None:
    from choir.distributed import fanout_from_env
    from choir.exceptions import UserError

    results = _replicas(fanout_from_env(distinct=True), _repo(tmp_path, PASSING), 3)
    assert sorted(r.manifest.platform.worker for r in results
                  if not isinstance(r, Exception)) == ["w0", "w1"]
    [refused] = [r for r in results if isinstance(r, Exception)]
    assert isinstance(refused, UserError) and "need one worker each" in str(refused)


def test_a_resumed_round_places_its_missing_replica_on_another_worker(cluster: LocalCluster,
                                                                       tmp_path: Path) -> None:
    """Review 17c: which workers ran a verifier's replicas was kept in one fanout's memory.
    A coordinator killed after replica 0 landed (its result kept by the checkpoint) and
    resumed placed replica 1 on the least loaded worker of a fresh fanout: the same one,
    so one worker gave both PARANOID votes. The replicas sealed in the store count."""
    from choir.distributed import fanout_from_env
    from choir.evidence.artifacts import ArtifactStore
    from choir.evidence.target import resolve_target
    from choir.models import StepSpec, VerifierKind, VerifierSpec
    from choir.sandbox import get_sandbox

    repo = _repo(tmp_path, PASSING)
    spec = VerifierSpec(name="unit", kind=VerifierKind.SMOKE,
                        steps=(StepSpec(name="run", command="echo fine"),))
    target, store = resolve_target(repo), ArtifactStore()
    for run_ids in (("round-unit-0", "round-unit-1"),  # one round, resumed between
                    ("run-r0-unit-0", "run-r1-unit-1")):  # a later round's rerun (17e)
        workers = []
        for run_id in run_ids:  # each in a fanout of its own, as each round (or process) has
            fanout, sandbox = fanout_from_env(distinct=True), get_sandbox("bwrap")
            try:
                workers.append(fanout.run_verifier(
                    spec, repo=repo, sandbox=sandbox, store=store, run_id=run_id,
                    target=target).manifest.platform.worker)
            finally:
                sandbox.close()
                fanout.close()
        assert sorted(workers) == ["w0", "w1"], (run_ids, workers)


def test_a_replica_signed_by_another_worker_than_its_placement_is_refused(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator checks the signer, not the scheduler's placement: a replica the
    scheduler ran on w0 while the coordinator asked for w1 (as a compromised scheduler or a
    worker registered under another's name would arrange) does not count as w1's."""
    from choir.distributed import fanout_from_env
    from choir.distributed.fanout import DaskFanout
    from choir.exceptions import IntegrityError

    w0 = next(a for a, info in _workers(cluster).items() if info["name"] == "w0")
    monkeypatch.setattr(DaskFanout, "_place", lambda self, ran, verifier, sealed: (w0, "w1"))
    [refused] = _replicas(fanout_from_env(distinct=True), _repo(tmp_path, PASSING), 1)
    assert isinstance(refused, IntegrityError)
    assert "placed on worker 'w1' but 'w0' signed" in str(refused)


@pytest.mark.parametrize(("role", "cert", "name", "why"), [
    ("worker", "w0", "w1", "refused worker name 'w1'"),  # a worker posing as another
    ("client", "coordinator", "coordinator", "refused 'register-worker' to a client peer"),
])
def test_only_a_worker_certificate_registers_a_worker_under_its_own_name(
        cluster: LocalCluster, role: str, cert: str, name: str, why: str) -> None:
    import asyncio

    from distributed.core import rpc

    stolen = _as(cluster.pki, role, cert)

    async def register() -> Any:
        async with rpc(cluster.address,
                       connection_args=stolen.get_connection_args("client")) as scheduler:
            return await getattr(scheduler, "register-worker")(name=name)

    with pytest.raises(PermissionError, match=why):
        asyncio.run(register())


def _as(pki: ClusterPKI, role: Any, name: str) -> Any:
    """Dask ``Security`` presenting ``pki``'s certificate ``name`` of ``role`` (a stolen one)."""
    from distributed.security import Security

    files = pki.issue(role, name)
    return Security(  # type: ignore[no-untyped-call]
        require_encryption=True, tls_ca_file=str(pki.ca_file),
        tls_client_cert=str(files.cert), tls_client_key=str(files.key))


def test_a_compromised_worker_cannot_command_the_others(cluster: LocalCluster) -> None:
    """A worker's certificate (its key read by code that broke out on that worker) is let in
    by TLS: it may not act as a client (submit tasks, run code) nor call another worker's
    code-running operations directly."""
    import asyncio

    from distributed.core import rpc

    stolen = _as(cluster.pki, "worker", "w0")
    assert _rogue(cluster.address, stolen).startswith("refused"), "a worker acted as a client"
    log = (cluster.root / "scheduler.log").read_text()
    assert "refused 'register-client' to a worker peer" in log

    async def run_on_peer() -> Any:
        async with rpc(next(iter(_workers(cluster))),
                       connection_args=stolen.get_connection_args("client")) as peer:
            return await peer.run(function=_dumps(_forge()))

    with pytest.raises(Exception, match="refused"):
        asyncio.run(run_on_peer())


class _Plant:
    """Unpickled, it writes a file named for the process that loaded it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"import os, sys; open({str(self.folder)!r} + '/ran-' + "
                       "str(os.getpid()), 'w').write(' '.join(sys.argv)[-60:])",))


def test_a_worker_certificate_runs_no_code_by_pickle_on_any_peer(
        cluster: LocalCluster, tmp_path: Path) -> None:
    """Review 23c, critical: the guard checked operations, but Dask unpickles each
    ``ToPickle`` value (and, on a worker, each pickled ``Serialize``) while it reads a
    message, before any handler runs. One message to an open operation carrying a payload
    ran code in the scheduler and in every worker, which then sealed PASS for a failing tree.
    Now nothing but the process's driver (clients for the scheduler, the scheduler for a
    worker) may send more than plain data, and the connection that tries is dropped."""
    import asyncio

    from distributed.comm import connect
    from distributed.protocol import pickle as dask_pickle
    from distributed.protocol.serialize import Serialize, ToPickle

    marks = tmp_path / "marks"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)  # the cluster's processes may run as another user
    stolen = _as(cluster.pki, "worker", "w0").get_connection_args("client")
    peers = [cluster.address, *_workers(cluster)]
    answers: list[str] = []

    async def send(address: str, msg: dict[str, Any]) -> None:
        comm = await connect(address, **stolen)
        try:
            await comm.write(msg)
            answers.append(repr(await asyncio.wait_for(comm.read(), 10))[:200])
        except Exception as exc:  # noqa: BLE001 - the peer drops the connection: expected
            answers.append(f"{type(exc).__name__}: {exc}"[:200])
        finally:
            comm.abort()

    async def attack() -> None:
        for address in peers:
            await send(address, {"op": "identity", "reply": True, "x": ToPickle(_Plant(marks))})
            await send(address, {"op": "get_data", "reply": True, "keys": [],
                                 "x": Serialize(_Plant(marks))})
        # an operation that unpickles an argument itself: the scheduler's drivers' only
        await send(cluster.address, {"op": "workers_to_close", "reply": True,
                                     "key": dask_pickle.dumps(_Plant(marks))})

    asyncio.run(attack())
    assert sorted(p.name for p in marks.iterdir()) == [], answers
    # the cluster still serves its own client
    assert len(_workers(cluster)) == 2


def test_a_worker_stream_speaks_only_for_its_own_worker(cluster: LocalCluster,
                                                        tmp_path: Path) -> None:
    """Dask merges a stream's ``worker`` into each message it carries, and a message may
    name another: a worker said another had finished a task, or sent a client's messages
    (``update-graph`` unpickles a graph) on its worker stream. The scheduler now refuses
    both and drops the worker."""
    import asyncio

    from distributed import Worker
    from distributed.security import Security

    files = cluster.pki.issue("worker", "w2")
    own = Security(  # type: ignore[no-untyped-call]
        require_encryption=True, tls_ca_file=str(cluster.pki.ca_file),
        tls_client_cert=str(files.cert), tls_client_key=str(files.key),
        tls_worker_cert=str(files.cert), tls_worker_key=str(files.key))
    victim = next(iter(_workers(cluster)))
    log = cluster.root / "scheduler.log"
    before = len(log.read_text())

    async def hostile(msg: dict[str, Any]) -> None:
        async with Worker(cluster.address, security=own, name="w2", nthreads=1,  # type: ignore[no-untyped-call]
                          host="127.0.0.1", local_directory=str(tmp_path / "w2"),
                          dashboard=False) as worker:
            worker.batched_stream.send(msg)
            for _ in range(100):
                await asyncio.sleep(0.1)
                if worker.batched_stream.comm is None or worker.batched_stream.comm.closed():
                    return

    asyncio.run(hostile({"op": "release-worker-data", "key": "choir-x", "worker": victim,
                         "stimulus_id": "forged"}))
    asyncio.run(hostile({"op": "client-releases-keys", "keys": ["choir-x"],
                         "client": "Client-forged"}))
    said = log.read_text()[before:]
    assert "refused 'release-worker-data' on a stream that is not that worker's own" in said
    assert "refused 'client-releases-keys' on a stream that is not that client's own" in said
    assert len(_workers(cluster)) == 2  # the honest workers serve on


def test_a_worker_certificate_speaks_for_no_other_worker(cluster: LocalCluster) -> None:
    """Review 24a: the guard checked the caller's role, not whose worker it named. w0's
    certificate unregistered w1 at the scheduler and killed w1's nanny: PARANOID then had
    one worker left for two replicas (and w0's name was free for an impostor)."""
    import asyncio

    from distributed.core import rpc

    stolen = _as(cluster.pki, "worker", "w0").get_connection_args("client")
    workers = _workers(cluster)
    [(w1, info)] = [(a, i) for a, i in workers.items() if i["name"] == "w1"]
    said: list[str] = []

    async def attempt(peer_address: str, op: str, **msg: Any) -> None:
        async with rpc(peer_address, connection_args=stolen) as peer:
            try:
                said.append(f"{op}: {await getattr(peer, op)(**msg)}")
            except Exception as exc:  # noqa: BLE001 - a refusal is the expected answer
                said.append(f"{op}: {type(exc).__name__}: {exc}")

    async def attack() -> None:
        await attempt(cluster.address, "heartbeat_worker", address=w1, metrics={})
        await attempt(cluster.address, "unregister", address=w1, stimulus_id="forged",
                      close=True)
        # w1's name is an alias of its address to Dask (review 24b)
        await attempt(cluster.address, "unregister", address="w1", stimulus_id="forged",
                      close=True)
        await attempt(cluster.address, "heartbeat_worker", address="w1", metrics={})
        await attempt(info["nanny"], "kill", timeout=5)

    asyncio.run(attack())
    assert all("refused" in line for line in said), said
    assert sorted(str(i["name"]) for i in _workers(cluster).values()) == ["w0", "w1"], said


def test_no_event_a_worker_sends_reaches_the_coordinator(cluster: LocalCluster,
                                                         tmp_path: Path) -> None:
    """Review 24a, critical: Dask's client subscribes to "warn" events as it starts and
    unpickles each one's message; unsubscribing after the start left a window, and a worker
    (its own stream, its own name) flooding "warn" events ran its code in the coordinator on
    its first connection. The scheduler now drops a worker's events, and no client of
    Choir's subscribes to any or handles one."""
    import asyncio
    import threading

    from distributed import Worker
    from distributed.security import Security

    from choir.distributed.fanout import DaskFanout

    marks = tmp_path / "marks"
    marks.mkdir()
    files = cluster.pki.issue("worker", "w3")
    own = Security(  # type: ignore[no-untyped-call]
        require_encryption=True, tls_ca_file=str(cluster.pki.ca_file),
        tls_client_cert=str(files.cert), tls_client_key=str(files.key),
        tls_worker_cert=str(files.cert), tls_worker_key=str(files.key))
    blob = _dumps(_Plant(marks))  # type: ignore[arg-type]
    stop, ready = threading.Event(), threading.Event()

    async def flood() -> None:
        async with Worker(cluster.address, security=own, name="w3", nthreads=1,  # type: ignore[no-untyped-call]
                          host="127.0.0.1", local_directory=str(tmp_path / "w3"),
                          dashboard=False) as worker:
            ready.set()
            while not stop.is_set():
                for _ in range(20):
                    worker.log_event("warn", {"message": blob})
                await asyncio.sleep(0.002)

    flooding = threading.Thread(target=lambda: asyncio.run(flood()), daemon=True)
    flooding.start()
    try:
        assert ready.wait(30), "the flooding worker did not start"
        for _ in range(3):  # each connection is a fresh window
            fanout = DaskFanout(cluster.address, {}, timeout_s=10, pki=cluster.pki)
            fanout._connect()
            time_left = 20
            while time_left and not list(marks.iterdir()):
                threading.Event().wait(0.05)
                time_left -= 1
            fanout.close()
    finally:
        stop.set()
        flooding.join(30)
    assert list(marks.iterdir()) == []


def _dumps(func: Callable[[], Any]) -> bytes:
    from distributed.protocol.pickle import dumps

    return dumps(func)  # type: ignore[no-any-return]


def _workers(cluster: LocalCluster) -> dict[str, Any]:
    from distributed import Client

    with Client(cluster.address, timeout=10, set_as_default=False,  # type: ignore[no-untyped-call]
                security=cluster.pki.client_security()) as own:
        return own.scheduler_info(n_workers=-1)["workers"]  # type: ignore[no-any-return]


def test_a_scheduler_with_another_roles_certificate_is_not_the_clusters(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compromised worker that gets between the coordinator and the scheduler (its port,
    its address) and answers as a scheduler with its worker certificate, which TLS accepts
    (Dask checks no host names): the coordinator refuses to send it anything."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from choir.app.verify import verify_tree
    from choir.models import Mood

    files = cluster.pki.issue("worker", "w0")
    info = tmp_path / "fake.json"
    fake = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--protocol", "tls",
         "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--dashboard-address",
         "127.0.0.1:0", "--tls-ca-file", str(cluster.pki.ca_file), "--tls-cert",
         str(files.cert), "--tls-key", str(files.key), "--scheduler-file", str(info)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (info.exists() and info.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        monkeypatch.setenv("CHOIR_SCHEDULER", json.loads(info.read_text())["address"])
        outcome = verify_tree(_repo(tmp_path, PASSING), mood=Mood.SKEPTICAL,
                              sandbox_name="bwrap")
    finally:
        os.killpg(fake.pid, signal.SIGTERM)
        fake.wait(timeout=10)
    assert outcome.status != "PASS" and outcome.contract["attestations"] == []
    [report] = outcome.contract["reports"]
    assert "not the cluster's scheduler" in json.dumps(report)
