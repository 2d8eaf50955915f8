"""``choir verify`` fanned out to a real local Dask cluster: a scheduler and two worker
processes started by the test, verifiers in bubblewrap on the workers, the evidence landed,
re-hashed, reported and attested on the coordinator, and ``choir audit`` clean afterwards."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="the distributed extra is not installed: "
                    "pip install 'choir[distributed]'")

from choir.distributed.local_cluster import LocalCluster  # noqa: E402
from tests import dask_cluster as _dask  # noqa: E402

cluster, dask_cluster = _dask.cluster, _dask.dask_cluster  # the fixtures

pytestmark = pytest.mark.bwrap

CHOIR_YAML = textwrap.dedent(
    """\
    max_parallel: 8
    verifiers:
    {verifiers}
    """
)


def verifier(name: str, command: str) -> str:
    return textwrap.indent(textwrap.dedent(f"""\
        {name}:
          kind: smoke
          steps:
            - name: run
              command: {command}
        """), "  ")


def test_verifiers_run_on_the_workers_and_land_as_evidence(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import choir.distributed.worker as worker
    from choir.app.verify import verify_tree
    from choir.audit.integrity import audit
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Mood
    from choir.verification import load_manifest

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "data.txt").write_text("the tree under test\n")
    checks = [verifier(f"check{i}", f"sleep 1; grep -q 'under test' data.txt && "
                       f"echo {i} > $CHOIR_OUT/n.txt") for i in range(4)]
    (repo / "choir.yaml").write_text(CHOIR_YAML.format(verifiers="".join(checks)))
    ran_here: list[object] = []  # the workers' code, should it run in this process
    monkeypatch.setattr(worker, "run_on_worker", lambda *a: ran_here.append(a))
    began = time.monotonic()
    outcome = verify_tree(repo, mood=Mood.SKEPTICAL, sandbox_name="bwrap")
    took = time.monotonic() - began
    contract = outcome.contract
    assert outcome.passed, contract["summary"]
    assert sorted(contract["plan"]) == [f"check{i}" for i in range(4)]
    assert len(contract["attestations"]) == 4
    store = ArtifactStore()
    for run in contract["threads"]:
        manifest = load_manifest(store, contract["manifest"]["runs"][run["run_id"]])
        assert manifest.platform.sandbox == "bwrap" and manifest.platform.isolation == "namespace"
        n = manifest.files["out/n.txt"]
        assert store.verify(n) and store.read_bytes(n) == f"{run['verifier'][-1]}\n".encode()
    # the sandboxes ran on the workers: each unpacked the snapshot in its own directory
    for local in cluster.worker_dirs:
        assert list(local.rglob("choir-tree-*/data.txt")), f"no verifier ran on {local.name}"
    assert took < 4 * 1 + 3  # side by side, not one after another (4 x sleep 1)
    result = audit()
    assert result.ok, result
    assert ran_here == []  # nothing ran in this process


def test_a_failing_verifier_on_a_worker_fails_the_run(
        cluster: LocalCluster, tmp_path: Path) -> None:
    from choir.app.verify import verify_tree
    from choir.models import Mood

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(CHOIR_YAML.format(
        verifiers=verifier("good", "exit 0") + verifier("bad", "echo broken; exit 3")))
    outcome = verify_tree(repo, mood=Mood.SKEPTICAL, sandbox_name="bwrap")
    assert outcome.status == "FAIL"
    results = {t["verifier"]: t["result"] for t in outcome.contract["threads"]}
    assert results == {"good": "PASS", "bad": "FAIL"}
    assert "broken" in outcome.contract["tail_log"]


def test_no_scheduler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from choir.app.verify import verify_tree
    from choir.distributed.pki import ClusterPKI
    from choir.exceptions import UserError
    from choir.models import Mood

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once closed
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(CHOIR_YAML.format(verifiers=verifier("good", "exit 0")))
    ClusterPKI.configured().ensure()  # certificates, but no scheduler behind the address
    monkeypatch.setenv("CHOIR_SCHEDULER", f"tls://127.0.0.1:{port}")
    monkeypatch.setenv("CHOIR_SCHEDULER_TIMEOUT_S", "2")
    with pytest.raises(UserError, match="CHOIR_SCHEDULER"):
        verify_tree(repo, mood=Mood.SKEPTICAL, sandbox_name="bwrap")


async def test_choir_run_green_threads_fan_out_too(
        cluster: LocalCluster, tmp_path: Path) -> None:
    """The loop's green threads take the same path: run on a worker, attested here, ASSERTed."""
    from choir.attest import AttestationStore
    from choir.graph.runner import run_work_item

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(
        "sandbox: {backend: bwrap}\n" + CHOIR_YAML.format(
            verifiers=verifier("unit", "echo ran > $CHOIR_OUT/mark").replace(
                "kind: smoke", "kind: unit_tests")))
    item = tmp_path / "item.yaml"
    item.write_text("id: dist\ngoal: g\nrepo: ./repo\n"
                    "executor: {kind: command, command: 'true'}\n")
    out = await run_work_item(item, run_id="dist-run")
    assert out.status == "asserted", out
    [att] = [a for a in AttestationStore() if a.body.verifier == "unit"]
    assert att.body.environment.sandbox == "bwrap"
    # the verifier read the snapshot a worker unpacked (this test's choir.yaml, on a worker)
    text = (repo / "choir.yaml").read_text()
    assert any(p.read_text() == text for local in cluster.worker_dirs
               for p in local.rglob("choir-tree-*/choir.yaml"))


def test_a_worker_cannot_run_code_on_the_coordinator(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compromised worker returns a pickle whose loading would run code here; the
    coordinator accepts plain data only (msgpack), so nothing runs and nothing is attested."""
    import choir.distributed.fanout as fanout
    from choir.app.verify import verify_tree
    from choir.models import Mood

    marker = tmp_path / "pwned"

    def hostile_worker(*args: object) -> object:
        class Payload:
            def __reduce__(self) -> tuple[object, tuple[str, str]]:
                return open, (str(marker), "w")  # unpickling creates the marker

        return Payload()

    monkeypatch.setattr(fanout, "_run_on_worker", hostile_worker)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(CHOIR_YAML.format(verifiers=verifier("good", "exit 0")))
    outcome = verify_tree(repo, mood=Mood.SKEPTICAL, sandbox_name="bwrap")
    assert not marker.exists()
    # the refused reply is evidence of nothing: the thread is INCONCLUSIVE, nothing attested
    assert outcome.status == "FAIL" and outcome.contract["attestations"] == []
    [report] = outcome.contract["reports"]
    assert report["result"] == "INCONCLUSIVE" and report["verifier_type"] == "crashed"
    assert len(outcome.contract["manifest"]["crashed"]) == 1
