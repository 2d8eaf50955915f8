"""The docker backend against a remote engine: a SECOND dockerd on a loopback TCP port.

The test starts its own engine (own data-root, exec-root and pidfile; no iptables, no
bridge), builds the host-/usr test image inside it, and points ``DOCKER_HOST`` at it, so
the copy transfer is exercised over TCP exactly as against a remote machine. The running
engine is never touched. Skips when dockerd is not installed or we are not root (outside CI).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from choir.models import Limits
from choir.sandbox import _toolchain
from choir.sandbox._host_image import host_rootfs

pytestmark = pytest.mark.docker


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def remote_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``tcp://127.0.0.1:PORT`` of a dockerd this module started; stopped and removed after."""
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI is set but dockerd is missing or we are not root")
        pytest.skip("a second Docker engine needs dockerd and root")
    import docker

    root = tmp_path_factory.mktemp("eng")
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [dockerd, "--data-root", str(root / "data"), "--exec-root", str(root / "x"),
         "--pidfile", str(root / "dockerd.pid"), "-H", url, "--iptables=false",
         "--ip6tables=false", "--bridge=none"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    client = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                client = docker.DockerClient(base_url=url, timeout=10)
                client.ping()
                break
            except Exception:
                if client is not None:
                    client.close()
                    client = None
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.close()
                    pytest.fail("the second dockerd did not start:\n"
                                + (root / "dockerd.log").read_text()[-3000:])
                time.sleep(0.2)
        client.api.import_image_from_data(host_rootfs(), repository="choir-test", tag="host")
        yield url
    finally:
        if client is not None:
            client.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def remote(remote_engine: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DOCKER_HOST", remote_engine)
    monkeypatch.delenv("CHOIR_DOCKER_TRANSFER", raising=False)
    monkeypatch.delenv("CHOIR_DOCKER_IMAGE", raising=False)
    return remote_engine


def _sandbox_recording_mounts(
        monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[list[dict[str, Any]]]]:
    """A docker sandbox; every container created is inspected, as the engine reports it."""
    from docker.models.containers import ContainerCollection

    from choir.sandbox.docker import DockerSandbox

    seen: list[list[dict[str, Any]]] = []
    create = ContainerCollection.create

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        container = create(self, *args, **kwargs)
        container.reload()
        seen.append(container.attrs["Mounts"])
        return container

    monkeypatch.setattr(ContainerCollection, "create", recording)
    return DockerSandbox(), seen


def _run(sandbox: Any, command: str, repo: Path, out: Path, *, out_mb: int = 64,
         timeout_s: float = 60) -> tuple[Any, str]:
    chunks: list[bytes] = []
    result = sandbox.exec(command, repo=repo, out_dir=out, env={}, timeout_s=timeout_s,
                          limits=Limits(out_mb=out_mb), network=False, sink=chunks.append)
    return result, b"".join(chunks).decode(errors="replace")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "data.txt").write_text("from the snapshot\n")
    (repo / "private.txt").write_text("mode 600\n")
    os.chmod(repo / "private.txt", 0o600)
    return repo


def test_copy_mode_runs_contained_with_no_bind_for_repo_or_output(
        remote: str, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox, mounts = _sandbox_recording_mounts(monkeypatch)
    assert sandbox.transfer == "copy"  # detected from DOCKER_HOST=tcp://
    out = tmp_path / "out"
    script = ("cat pkg/data.txt private.txt; id -u; "
              "touch /repo/planted 2>/dev/null && echo REPO-WRITABLE; "
              "touch /planted 2>/dev/null && echo ROOT-WRITABLE; "
              "grep CapEff /proc/self/status; ls /sys/class/net; "
              "echo result > $CHOIR_OUT/report.txt; mkdir -p $CHOIR_OUT/sub; "
              "echo nested > $CHOIR_OUT/sub/n.txt")
    try:
        result, log = _run(sandbox, script, repo, out)
    finally:
        sandbox.close()
    assert result.infra_error is None and result.exit_code == 0, log
    assert "from the snapshot" in log and "mode 600" in log
    assert "\n65534\n" in log
    assert "WRITABLE" not in log
    assert "CapEff:\t0000000000000000" in log
    assert log.split("CapEff")[1].split("\n")[1:] == ["lo", ""]  # no network but loopback
    assert (out / "report.txt").read_text() == "result\n"
    assert (out / "sub" / "n.txt").read_text() == "nested\n"
    assert not (repo / "planted").exists()
    # the step container: repo and output are engine volumes, never binds of host folders
    loader, step = mounts  # the loader (never started), then the step's container
    assert [m["Type"] for m in loader if m["Destination"] == "/repo"] == ["volume"]
    by_dest = {m["Destination"]: m for m in step}
    assert by_dest["/repo"]["Type"] == "volume" and by_dest["/repo"]["RW"] is False
    # $CHOIR_OUT (/choir/vol/out) lives in a volume too
    assert by_dest["/choir/vol"]["Type"] == "volume" and by_dest["/choir/vol"]["RW"] is True
    binds = [m for m in step if m["Type"] == "bind"]
    assert binds and all(m["RW"] is False for m in binds)  # the toolchain only, read-only
    tools = _toolchain.choose(repo.resolve(), None, ()).binds  # the project's interpreter
    assert {m["Destination"] for m in binds} <= {"/usr", "/etc/alternatives", *tools}
    assert not any(str(repo) in m["Source"] or str(out) in m["Source"] for m in binds)


def test_engine_keeps_nothing_after_a_run(remote: str, repo: Path, tmp_path: Path) -> None:
    import docker

    from choir.sandbox.docker import DockerSandbox

    sandbox = DockerSandbox()
    try:
        result, log = _run(sandbox, "echo x > $CHOIR_OUT/x", repo, tmp_path / "out")
        assert result.exit_code == 0, log
    finally:
        sandbox.close()
    client = docker.DockerClient(base_url=remote, timeout=10)
    try:
        assert client.containers.list(all=True, filters={"label": "choir.managed=1"}) == []
        assert client.volumes.list() == []
    finally:
        client.close()


def test_links_fifos_and_oversize_output_never_reach_the_host(
        remote: str, repo: Path, tmp_path: Path) -> None:
    """The attack: a step leaves a symlink to /etc/shadow, a FIFO, and more than out_mb."""
    from choir.sandbox.docker import DockerSandbox

    sandbox = DockerSandbox()
    out = tmp_path / "out"
    shadow_before = os.stat("/etc/shadow") if os.path.exists("/etc/shadow") else None
    try:
        result, log = _run(sandbox, "ln -s /etc/shadow $CHOIR_OUT/shadow; "
                                    "ln -s / $CHOIR_OUT/root; mkfifo $CHOIR_OUT/pipe; "
                                    "echo kept > $CHOIR_OUT/kept.txt", repo, out)
        assert result.exit_code == 0, log
        assert sorted(p.name for p in out.iterdir()) == ["cache", "home", "kept.txt", "tmp"]
        assert not any(p.is_symlink() for p in out.rglob("*"))
        assert "'out/shadow': a symlink -> '/etc/shadow'" in log, log
        # more than the cap in files each below it: stopped when copied back, never PASS
        out2 = tmp_path / "out2"
        result, log = _run(sandbox, "for i in 1 2 3; do head -c 600000 /dev/zero "
                                    "> $CHOIR_OUT/f$i; done", repo, out2, out_mb=1)
    finally:
        sandbox.close()
    assert result.limit_exceeded is not None and result.exit_code != 0, log
    total = sum(p.stat().st_size for p in out2.rglob("*") if p.is_file())
    assert total <= 1024 * 1024
    if shadow_before is not None:
        after = os.stat("/etc/shadow")
        assert (after.st_uid, after.st_mode) == (shadow_before.st_uid, shadow_before.st_mode)


def test_the_snapshot_is_loaded_once_per_sandbox_and_again_when_it_changes(
        remote: str, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox, mounts = _sandbox_recording_mounts(monkeypatch)
    try:
        for i in range(3):
            result, log = _run(sandbox, "cat pkg/data.txt", repo, tmp_path / f"out{i}")
            assert result.exit_code == 0 and "from the snapshot" in log, log
        assert len(mounts) == 4  # one loader, three steps
        (repo / "pkg" / "data.txt").write_text("changed in place\n")
        result, log = _run(sandbox, "cat pkg/data.txt", repo, tmp_path / "out3")
        assert "changed in place" in log, log
        assert len(mounts) == 6  # a new loader for the changed tree
    finally:
        sandbox.close()


def test_a_later_step_sees_what_an_earlier_one_left(remote: str, repo: Path,
                                                    tmp_path: Path) -> None:
    """$CHOIR_OUT is shared by the steps of one verifier: copied in again for each step."""
    from choir.sandbox.docker import DockerSandbox

    sandbox = DockerSandbox()
    out = tmp_path / "out"
    try:
        first, log = _run(sandbox, "echo one > $CHOIR_OUT/step1", repo, out)
        assert first.exit_code == 0, log
        second, log = _run(sandbox, "cat $CHOIR_OUT/step1 && echo two >> $CHOIR_OUT/step1",
                           repo, out)
    finally:
        sandbox.close()
    assert second.exit_code == 0 and "one" in log, log
    assert (out / "step1").read_text() == "one\ntwo\n"


def test_the_manifest_records_the_copy_transfer(remote: str, repo: Path) -> None:
    from choir.evidence.artifacts import ArtifactStore
    from choir.evidence.target import resolve_target
    from choir.models import StepSpec, VerifierKind, VerifierSpec
    from choir.sandbox.docker import DockerSandbox
    from choir.verification.pipeline import run_verifier

    spec = VerifierSpec(name="remote", kind=VerifierKind.SMOKE,
                        steps=(StepSpec(name="check", command="test -f pkg/data.txt && "
                                        "echo ok > $CHOIR_OUT/ok"),))
    sandbox = DockerSandbox()
    try:
        result = run_verifier(spec, repo=repo, sandbox=sandbox, store=ArtifactStore(),
                              run_id="remote-1", target=resolve_target(repo))
    finally:
        sandbox.close()
    assert result.status == "PASS", result.tail_log
    assert result.manifest.platform.transfer == "copy"
    assert "out/ok" in result.manifest.files


def test_an_executor_cannot_use_copy_mode(remote: str, repo: Path, tmp_path: Path) -> None:
    """Changes to the repo do not come back in copy mode: refused, never silently lost."""
    from choir.sandbox.docker import DockerSandbox

    sandbox = DockerSandbox()
    try:
        result = sandbox.exec("true", repo=repo, out_dir=tmp_path / "out", env={},
                              timeout_s=10, limits=Limits(), network=False,
                              sink=lambda _: None, repo_writable=True)
    finally:
        sandbox.close()
    assert result.infra_error is not None and "transfer" in result.infra_error
