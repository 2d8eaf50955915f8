"""A compromised worker against the coordinator (review 16), on a real TLS Dask cluster: code
shipped to a worker by value stands for what a worker's owner could run there. Nothing it
sends may run code here, hang the command, fill the store past the verifier's limits, or
write to the coordinator's terminal; each is INCONCLUSIVE, nothing attested."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="the distributed extra is not installed: "
                    "pip install 'choir[distributed]'")

from choir.distributed.local_cluster import LocalCluster  # noqa: E402
from tests import dask_cluster as _dask  # noqa: E402

cluster, dask_cluster = _dask.cluster, _dask.dask_cluster  # the fixtures

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]


def _repo(tmp_path: Path, limits: str = "") -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(textwrap.dedent(f"""\
        verifiers:
          good:
            kind: smoke
            timeout_s: 5
            {limits}
            steps:
              - name: run
                command: exit 0
        """))
    return repo


def _inconclusive_and_unattested(repo: Path) -> dict[str, object]:
    from choir.app.verify import verify_tree
    from choir.models import Mood

    outcome = verify_tree(repo, mood=Mood.SKEPTICAL, sandbox_name="bwrap")
    assert outcome.status == "FAIL" and outcome.contract["attestations"] == []
    [report] = outcome.contract["reports"]
    assert report["result"] == "INCONCLUSIVE", report
    return report


def test_an_exception_a_worker_raises_is_never_unpickled_here(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F1, critical: a task's error travels as pickled exception bytes, which Dask loaded in
    the coordinator whatever ``deserializers=["msgpack"]`` said. With Dask's tblib hook
    disabled in the worker (its own process), the payload ran here."""
    import choir.distributed.fanout as fanout

    ran = tmp_path / "ran"
    ran.mkdir()

    def hostile_worker(*args: object) -> object:
        import tblib.pickling_support

        tblib.pickling_support.install = lambda *a, **k: None

        class Evil(Exception):
            def __reduce__(self) -> tuple[object, tuple[str]]:
                return exec, (f"import os; open('{ran}/%d' % os.getpid(), 'w')",)

        raise Evil("x")

    monkeypatch.setattr(fanout, "_run_on_worker", hostile_worker)
    report = _inconclusive_and_unattested(_repo(tmp_path))
    assert str(os.getpid()) not in {p.name for p in ran.iterdir()}, \
        "the worker's exception ran its code in the coordinator"
    assert "is not loaded" in str(report["summary"])


def test_a_worker_that_never_answers_is_inconclusive_not_a_hang(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F2: an unpinned run (CALM, SKEPTICAL, BOLD) waited for its answer with no deadline."""
    import choir.distributed.fanout as fanout

    def silent_worker(*args: object) -> object:
        time.sleep(20)
        return {}

    monkeypatch.setattr(fanout, "_run_on_worker", silent_worker)
    monkeypatch.setattr(fanout, "ANSWER_MARGIN_S", 2)
    started = time.monotonic()
    report = _inconclusive_and_unattested(_repo(tmp_path))
    assert time.monotonic() - started < 18
    assert "no answer from the cluster" in str(report["summary"])


def test_a_run_larger_than_the_verifiers_limits_is_refused_not_landed(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        choir_home: Path) -> None:
    """F3: a signed, self-consistent run carrying 8 MiB in ``$CHOIR_OUT`` against
    ``out_mb: 1`` was stored and attested."""
    import choir.distributed.fanout as fanout

    def padded_worker(*args: object) -> object:
        from choir._core.canonical import blake3_hex
        from choir.distributed.worker import _certificate, run_on_worker, seal_for_coordinator
        from choir.models import RunManifest

        remote = run_on_worker(*args)
        manifest = RunManifest.model_validate_json(remote.manifest_json)
        big = b"\0" * (8 << 20)
        manifest = manifest.model_copy(update={"files": {**manifest.files,
                                                         "out/big.bin": blake3_hex(big)}})
        return seal_for_coordinator(str(args[2]), manifest,
                                    {**remote.files, "out/big.bin": big},
                                    _certificate()).model_dump()

    monkeypatch.setattr(fanout, "_run_on_worker", padded_worker)
    report = _inconclusive_and_unattested(_repo(tmp_path, "limits: {out_mb: 1, out_files: 5}"))
    assert "more than limits.out_mb" in str(report["summary"])
    assert not list(choir_home.rglob("big.bin"))


def test_what_a_worker_prints_never_reaches_the_coordinators_terminal(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    """F4: Dask's default handlers printed a worker's ``print`` and ``warn`` events here:
    escape sequences and a fake PASS over a FAIL, into ``--json`` on stdout too."""
    import choir.distributed.fanout as fanout

    def chatty_worker(*args: object) -> object:
        from distributed import print as dask_print

        dask_print("\x1b]0;owned\x07PASS  all verifiers passed")
        time.sleep(0.5)
        raise RuntimeError("then fail")

    monkeypatch.setattr(fanout, "_run_on_worker", chatty_worker)
    _inconclusive_and_unattested(_repo(tmp_path))
    time.sleep(0.5)
    out, err = capfd.readouterr()
    assert "owned" not in out + err and "all verifiers passed" not in out + err


def test_a_scheduler_timeout_that_is_no_number_of_seconds_is_a_usage_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """F8: ``nan`` and ``inf`` passed the check and ended as a crashed run, exit 1."""
    from choir.distributed.fanout import TIMEOUT_ENV, fanout_from_env
    from choir.exceptions import UserError

    monkeypatch.setenv("CHOIR_SCHEDULER", "tls://127.0.0.1:1")
    for raw in ("nan", "inf", "-1", "0"):
        monkeypatch.setenv(TIMEOUT_ENV, raw)
        with pytest.raises(UserError, match="give a number of seconds above 0"):
            fanout_from_env()
