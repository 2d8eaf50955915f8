"""What a compromised worker answers, on a real TLS Dask cluster (review 23c): an answer for
another run than the one asked for, and an answer larger than the verifier's limits (raw, or
a compression bomb). Code shipped to a worker by value stands for what its owner could run
there. Each is INCONCLUSIVE for its thread, nothing attested, nothing landed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="the distributed extra is not installed: "
                    "pip install 'choir[distributed]'")

from choir.distributed.local_cluster import LocalCluster  # noqa: E402
from tests import dask_cluster as _dask  # noqa: E402
from tests.memory import PEAK_RSS  # noqa: E402

cluster, dask_cluster = _dask.cluster, _dask.dask_cluster  # the fixtures

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]


def _git_repo(tmp_path: Path, config: str) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(textwrap.dedent(config))
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=x", "-c", "user.email=x@x",
                    "commit", "-qm", "broken"], check=True)
    return repo


def test_an_answer_for_the_sibling_replicas_run_id_is_refused_not_landed(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        choir_home: Path) -> None:
    """F3 (23c): worker w0 runs a lying step under the run id of the other PARANOID replica
    and signs it for the id it was asked. It landed under the sibling's id, the sibling never
    ran, and the verify aborted (PromotionError: manifest_run_id)."""
    import choir.distributed.fanout as fanout
    from choir.app.verify import verify_tree
    from choir.models import Mood

    def sibling_id_worker(*args: object) -> object:
        from distributed import get_worker

        import choir.verification.pipeline as pipeline
        from choir.distributed.pki import sign_as
        from choir.distributed.remote_run import signed_bytes
        from choir.distributed.worker import _certificate, run_on_worker

        run_id = str(args[2])
        if get_worker().name != "w0":
            return run_on_worker(*args).model_dump()  # type: ignore[arg-type]
        honest = pipeline.run_verifier

        def lying(spec: object, *, sandbox: object, **kw: object) -> object:
            real = sandbox.exec  # type: ignore[attr-defined]
            sandbox.exec = lambda command, **k: real("echo all good", **k)  # type: ignore[attr-defined]
            return honest(spec, sandbox=sandbox, **kw)  # type: ignore[arg-type]

        pipeline.run_verifier = lying  # type: ignore[assignment]
        try:
            base, _, replica = run_id.rpartition("-")
            remote = run_on_worker(args[0], args[1], f"{base}-{1 - int(replica)}",  # type: ignore[arg-type]
                                   *args[3:])  # type: ignore[arg-type]
        finally:
            pipeline.run_verifier = honest
        _, signature = sign_as(_certificate(), signed_bytes(run_id, remote.manifest_hash))
        return remote.model_copy(update={"signature": signature}).model_dump()

    monkeypatch.setattr(fanout, "_run_on_worker", sibling_id_worker)
    repo = _git_repo(tmp_path, """\
        max_parallel: 1
        verifiers:
          unit:
            kind: smoke
            timeout_s: 30
            steps:
              - name: run
                command: echo the tree is broken; exit 3
        """)
    outcome = verify_tree(repo, mood=Mood.PARANOID, sandbox_name="bwrap", claim="fixed")
    contract = outcome.contract
    assert outcome.status == "FAIL" and not outcome.passed
    results = {t["run_id"]: t["result"] for t in contract["threads"]}
    assert sorted(results.values()) == ["FAIL", "INCONCLUSIVE"], results
    [refused] = [r for r in contract["reports"] if r["result"] == "INCONCLUSIVE"]
    assert "not the run asked for" in str(refused["summary"])
    # only the honest replica (w1's FAIL) is sealed and attested; the refused one crashed
    [honest] = [run for run, result in results.items() if result == "FAIL"]
    assert list(contract["manifest"]["runs"]) == [honest]
    assert len(contract["attestations"]) == 1
    assert list(contract["manifest"]["crashed"]) == [run for run in results if run != honest]
    # nothing of w0's landed, under either id
    from choir.evidence.artifacts import ArtifactStore

    store = ArtifactStore()
    for run in results:
        sealed = store.sealed(run)
        if run == honest:
            assert sealed is not None and sealed[0].run_id == run
            assert sealed[0].platform.worker == "w1"
        else:
            assert sealed is None, "w0's answer landed"


BIG_ANSWER = PEAK_RSS + """
import json, sys
from pathlib import Path

import choir.distributed.fanout as fanout
from choir.app.verify import verify_tree
from choir.models import Mood

MODE, SIZE = sys.argv[2], 256 << 20


def big_answer(*args):
    # shipped by value (this is __main__): an answer of SIZE bytes against out_mb: 1
    from choir._core.canonical import blake3_hex
    from choir.distributed.worker import _certificate, run_on_worker, seal_for_coordinator
    from choir.models import RunManifest

    remote = run_on_worker(*args)
    manifest = RunManifest.model_validate_json(remote.manifest_json)
    big = bytes(SIZE)
    manifest = manifest.model_copy(update={"files": {**manifest.files,
                                                     "out/big.bin": blake3_hex(big)}})
    answer = seal_for_coordinator(str(args[2]), manifest, {**remote.files, "out/big.bin": big},
                                  _certificate()).model_dump()
    if MODE == "raw":
        return answer
    # a bomb: the frames say zstd, whatever the connection agreed; a few KiB on the wire
    import msgpack
    import zstandard
    from distributed.protocol.serialize import Serialized

    packed = msgpack.dumps(answer, use_bin_type=True)
    del answer, big
    return Serialized({"serializer": "msgpack", "compression": ("zstd",),
                       "num-sub-frames": 1, "writeable": (False,)},
                      [zstandard.ZstdCompressor().compress(packed)])


fanout._run_on_worker = big_answer
before = peak_rss_kib()
outcome = verify_tree(Path(sys.argv[1]), mood=Mood.SKEPTICAL, sandbox_name="bwrap")
[report] = outcome.contract["reports"]
print(json.dumps({"status": outcome.status, "result": report["result"],
                  "summary": str(report["summary"]), "attested": len(outcome.contract[
                      "attestations"]), "grew_mib": (peak_rss_kib() - before) / 1024}))
"""


@pytest.mark.parametrize("mode", ["raw", "zstd_bomb"])
def test_an_answer_past_the_limits_never_fills_the_coordinators_memory(
        cluster: LocalCluster, tmp_path: Path, choir_home: Path, mode: str) -> None:
    """F2 (23c): the cap (``limits.out_mb``) was checked only after Dask had read,
    decompressed (by the frame's own compression name, unbounded), deserialized and
    validated the whole answer: 1 GiB against ``out_mb: 1`` took the coordinator to 3.1 GiB.
    Here 256 MiB, raw or as a zstd bomb of a few KiB; the coordinator runs in a child process
    so that its peak RSS is its own."""
    repo = _git_repo(tmp_path, """\
        verifiers:
          unit:
            kind: smoke
            timeout_s: 30
            limits: {out_mb: 1, out_files: 5}
            steps:
              - name: run
                command: exit 0
        """)
    script = tmp_path / "coordinator.py"
    script.write_text(BIG_ANSWER)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script), str(repo), mode], capture_output=True,
                          text=True, timeout=240, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    print(mode, answer)
    assert answer["status"] == "FAIL" and answer["result"] == "INCONCLUSIVE", answer
    assert answer["attested"] == 0
    assert "limits.out_mb" in answer["summary"], answer
    assert answer["grew_mib"] < 160, answer
    assert not list(choir_home.rglob("big.bin"))
