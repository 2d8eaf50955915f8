"""Docker out of the box: the default image is built offline by Choir, a missing image is a
usage error with the fix, and ``auto`` says why it chose what it chose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from choir.sandbox.docker import DockerSandbox
from tests import forked

CHOIR = [sys.executable, "-m", "choir"]
needs_engine = pytest.mark.skipif(not DockerSandbox.available(), reason="no Docker engine")


def choir(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return forked.run([*CHOIR, *args], capture_output=True, text=True, timeout=300,
                      env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **env})


def repo(tmp_path: Path, sandbox: str = "") -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    (path / "choir.yaml").write_text(
        "verifiers:\n  unit:\n    kind: unit_tests\n    steps:\n"
        "      - {name: t, command: 'python3 -c \"print(1)\"'}\n" + sandbox)
    return path


@needs_engine
def test_the_host_image_is_built_offline_and_runs_a_step(tmp_path: Path) -> None:
    import docker

    from choir.sandbox._host_image import ensure_host_image

    name = f"choir-test:build-{uuid.uuid4().hex[:8]}"  # never the shared default image
    client = docker.from_env()
    try:
        ensure_host_image(client, name)
        ensure_host_image(client, name)  # idempotent
        box = DockerSandbox(image=name, host_usr=True)
        seen = bytearray()
        from choir.models import Limits

        (tmp_path / "r").mkdir()
        result = box.exec("id -u; python3 -c 'print(6*7)'", repo=tmp_path / "r",
                          out_dir=tmp_path / "out", env={}, timeout_s=60, limits=Limits(),
                          network=False, sink=seen.extend)
        box.close()
        assert result.exit_code == 0, bytes(seen)
        assert bytes(seen).split() == [b"65534", b"42"]
    finally:
        client.images.remove(name, force=True)
        client.close()


@needs_engine
def test_a_missing_configured_image_is_exit_2_with_the_fix(tmp_path: Path) -> None:
    # before: `--sandbox docker` ran and every verifier was INCONCLUSIVE with a 404
    path = repo(tmp_path, "sandbox: {backend: docker, image: 'nope-choir-missing:1'}\n")
    proc = choir("verify", "--repo", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "nope-choir-missing:1" in proc.stderr and "docker pull" in proc.stderr


def test_auto_says_why_it_chose_its_sandbox(tmp_path: Path) -> None:
    path = repo(tmp_path)
    proc = choir("verify", "--repo", str(path), "--json",
                 DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert proc.returncode == 0, proc.stderr
    assert "auto chose" in proc.stderr
    assert "passed over docker: no Docker engine answered at unix:///nonexistent" in proc.stderr
    assert json.loads(proc.stdout)["status"] == "PASS"
