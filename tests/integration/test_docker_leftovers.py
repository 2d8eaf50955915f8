"""Docker leftovers, against the real engine: a killed Choir process's container is removed by
the next process that uses the docker backend, and nothing else is ever touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from choir.models import Limits
from choir.sandbox.docker import (
    DEFAULT_IMAGE,
    LABEL,
    OWNER_HOST,
    OWNER_PID,
    DockerSandbox,
    cleanup_leftovers,
    run_labels,
)
from tests.sandboxes import docker_or_skip

pytestmark = pytest.mark.docker


@dataclass
class Engine:
    """The real engine, and the containers a test made (removed whatever happens)."""

    client: Any
    made: list[str] = field(default_factory=list)

    def sleeper(self, labels: dict[str, str]) -> Any:
        """A running ``sleep 600`` container with these labels."""
        container = self.client.containers.run(
            DEFAULT_IMAGE, ["sleep", "600"], detach=True, labels=labels, network_disabled=True,
            volumes={"/usr": {"bind": "/usr", "mode": "ro"}}, user="65534:65534",
        )
        self.made.append(container.id)
        return container

    def exists(self, cid: str) -> bool:
        import docker

        try:
            self.client.containers.get(cid)
        except docker.errors.NotFound:
            return False
        return True

    def removed(self, cid: str, within_s: float = 20.0) -> bool:
        """True once ``cid`` is gone. A parallel worker's sweep may be removing it as this
        one looks (the engine then refuses a second removal, and the container is still
        listed for a moment): removal is the guarantee, not who did it or when exactly."""
        deadline = time.monotonic() + within_s
        while self.exists(cid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Engine]:
    docker_or_skip()
    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CHOIR_ARTIFACT_DIR", str(tmp_path / "artifacts"))
    import docker

    eng = Engine(docker.from_env(timeout=60))
    yield eng
    for cid in eng.made:
        try:
            eng.client.containers.get(cid).remove(force=True)
        except docker.errors.NotFound:
            pass
    eng.client.close()


def dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_container_of_a_killed_process_is_removed_by_the_next_use(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    script = textwrap.dedent(f"""
        from pathlib import Path
        from choir.models import Limits
        from choir.sandbox import get_sandbox
        get_sandbox("docker").exec("sleep 600", repo=Path({str(repo)!r}),
            out_dir=Path({str(tmp_path / "out")!r}), env={{}}, timeout_s=900,
            limits=Limits(), network=False, sink=lambda _: None)
    """)
    import docker

    child = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 60
        found: list[Any] = []
        while not found and time.monotonic() < deadline:
            try:
                found = [c for c in engine.client.containers.list(
                    filters={"label": f"{LABEL}=1"}) if c.labels.get(OWNER_PID) == str(child.pid)]
            except docker.errors.NotFound:  # another worker's container went between the
                pass  # listing and its inspection (docker-py inspects each one it lists)
            time.sleep(0.1)
        assert found, "the child never started its container"
        engine.made.append(found[0].id)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    time.sleep(0.5)
    container = found[0]
    # "running": nobody cleaned up after the SIGKILL; "removing" or gone: another Choir
    # process (a parallel worker's sandbox) is sweeping it already, as the next use would

    status = "gone"
    if engine.exists(container.id):
        try:
            container.reload()
            status = container.status
        except docker.errors.NotFound:
            pass
    assert status in ("running", "removing", "gone"), status

    import choir.sandbox.docker as docker_mod

    monkeypatch.setattr(docker_mod, "_SWEPT_IN", None)  # as in a fresh process
    sandbox = DockerSandbox()
    try:
        result = sandbox.exec("true", repo=repo, out_dir=tmp_path / "out2", env={},
                              timeout_s=60, limits=Limits(), network=False,
                              sink=lambda _: None)
    finally:
        sandbox.close()
    assert result.exit_code == 0
    assert engine.removed(container.id)


def test_live_owner_and_unlabelled_containers_survive_cleanup(engine: Engine) -> None:
    now = time.time()
    live = engine.sleeper(run_labels(now, 600))  # owned by this very test process
    unlabelled = engine.sleeper({"choir.test": uuid.uuid4().hex})
    legacy = engine.sleeper({LABEL: "1"})  # an older Choir's: no owner to judge by
    foreign = engine.sleeper({**run_labels(now, 600), OWNER_HOST: "other/pid:[1]",
                              OWNER_PID: str(dead_pid())})
    gone = engine.sleeper({**run_labels(now, 600), OWNER_PID: str(dead_pid())})
    expired = engine.sleeper(run_labels(now - 10_000, 60))  # live owner, far past its time

    # another Choir process (a parallel test worker) may sweep some first, so the count it
    # returns is not asserted: what counts is which containers are left
    cleanup_leftovers(engine.client)

    assert engine.removed(gone.id) and engine.removed(expired.id)
    for survivor in (live, unlabelled, legacy, foreign):
        assert engine.exists(survivor.id)
        survivor.reload()
        assert survivor.status == "running"


def test_a_container_removed_while_the_sweep_lists_them_is_skipped(engine: Engine) -> None:
    """Two Choir processes sweep at once: a container the other one removes after the
    engine listed it, before this one looked at it, once made this sweep raise (the
    listing inspected each container: 404), so the rest stayed. Here the listing is the
    engine's own, and a leftover in it is removed before it returns."""
    now = time.time()
    first = engine.sleeper({**run_labels(now, 600), OWNER_PID: str(dead_pid())})
    second = engine.sleeper({**run_labels(now, 600), OWNER_PID: str(dead_pid())})
    api = engine.client.api
    listed = api.containers

    def racing(*args: Any, **kwargs: Any) -> Any:
        found = listed(*args, **kwargs)
        if any(row["Id"] == first.id for row in found):
            api.remove_container(first.id, force=True)  # the other process's sweep
        return found

    api.containers = racing
    try:
        cleanup_leftovers(engine.client)
    finally:
        del api.containers
    assert engine.removed(first.id) and engine.removed(second.id)

