"""``choir serve`` answers only a client that stands where the service stands (review 21a).

A service started without ``CAP_SYS_ADMIN`` (a hardened unit, ``setpriv``) could not hide
its key folder, and served a normal client: ``--sandbox auto`` chose ``local`` where cold
chose bwrap, and the step read the signing key. A client that dropped a capability was
answered by a worker holding it. A client's umask and ``ulimit`` did not reach its steps."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import forked
from tests.serving import (
    CHOIR,
    choir,
    make_repo,
    sandbox_name,
    start_service,
    wait_gone,
)
from tests.workitems import STEP_PY as PY

SETPRIV = shutil.which("setpriv")
needs_setpriv = pytest.mark.skipif(
    SETPRIV is None or os.geteuid() != 0,
    reason="needs setpriv(1) and root to drop CAP_SYS_ADMIN from the bounding set")
NO_SYS_ADMIN = [SETPRIV or "setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]

PROBE = ("import os, resource; m = os.umask(0); "
         "print(f'PROBE {m:03o} {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}')")
PROBE_CONFIG = f"""\
verifiers:
  unit:
    kind: unit_tests
    steps:
      - name: probe
        command: {PY} -c "{PROBE}"
    timeout_s: 60
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One service for the module's clients: the variables that name its home."""
    home = tmp_path_factory.mktemp("served") / "home"
    env = {"CHOIR_HOME": str(home), "CHOIR_ARTIFACT_DIR": str(home / "artifacts")}
    pid = start_service("--idle-timeout", "120", extra_env=env)
    yield env
    forked.run([*CHOIR, "serve", "--stop"], env={**os.environ, **env},
               capture_output=True, check=False)
    wait_gone(pid)


@needs_setpriv
def test_a_service_that_cannot_hide_its_key_folder_refuses_to_start(choir_home: Path) -> None:
    proc = subprocess.run([*NO_SYS_ADMIN, *CHOIR, "serve", "--idle-timeout", "1"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "key folder" in proc.stderr and "fix:" in proc.stderr
    assert not (choir_home / "serve" / "sock").exists()


@needs_setpriv
def test_a_client_without_a_capability_the_service_holds_runs_cold(
        tmp_path: Path, service: dict[str, str]) -> None:
    repo = make_repo(tmp_path / "repo", config=PROBE_CONFIG)
    proc = subprocess.run([*NO_SYS_ADMIN, *CHOIR, "verify", "--repo", str(repo), "--sandbox",
                           "local"], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **service, "CHOIR_SERVE": "require"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "stale" in proc.stderr and "CapBnd" in proc.stderr, proc.stderr


def test_the_clients_umask_and_limits_reach_its_steps(tmp_path: Path,
                                                      service: dict[str, str]) -> None:
    repo = make_repo(tmp_path / "repo", config=PROBE_CONFIG)
    line = (f"umask 077; ulimit -n 300; exec {' '.join(CHOIR)} verify --repo {repo} --json "
            f"--sandbox {sandbox_name()}")
    proc = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, **service, "CHOIR_SERVE": "require"})
    assert "PROBE 077 300" in _probe(proc), proc.stdout
    # the next client's worker is a fresh fork: the service's own are untouched
    umask = os.umask(0o022)
    os.umask(umask)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    proc = choir("verify", "--repo", str(repo), "--json", "--sandbox", sandbox_name(),
                 serve="require", extra_env=service)
    assert f"PROBE {umask:03o} {nofile}" in _probe(proc), proc.stdout + proc.stderr


def _probe(proc: subprocess.CompletedProcess[str]) -> str:
    """What the probe step printed, from the run's log."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = Path(json.loads(proc.stdout)["artifact_paths"][0])
    return (run / "logs" / "step-01-probe.log").read_text()
