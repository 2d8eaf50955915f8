"""The resource limits a step actually ran under are evidence (issue #10.3).

Each backend records what it enforced (memory, pids, cpus, $CHOIR_OUT cap; null when not) in
the run manifest, and ``attest_run`` signs that record into the attestation's environment. A
mood that requires limits (PARANOID) refuses a sandbox that cannot apply them: exit 2, nothing
run. cgroups are made unavailable for real by pointing the cgroup root at a folder that does
not exist, in the Choir process itself (never a fake cgroup filesystem).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from choir.attest import AttestationStore, load_signer
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import tree_hash
from choir.models import Limits, Mood, Result, StepSpec, Target, VerifierKind, VerifierSpec
from choir.sandbox import _cgroups, get_sandbox
from choir.verification import attest_run, load_manifest, run_verifier_thread
from tests.integration.test_verify_cli import CALC_OK, make_repo
from tests.sandboxes import isolated_backend

CGROUPS = Path("/sys/fs/cgroup")
LIMITS = Limits(memory_mb=300, pids=64, cpus=1.0, out_mb=16)

cgroups_writable = pytest.mark.skipif(
    not all(os.access(CGROUPS / c, os.W_OK) for c in ("pids", "memory")),
    reason="cgroup v1 pids/memory controllers are not writable here",
)

# `choir ...` with the cgroup root of the Choir process moved to argv[1] (a folder that does
# not exist): the cgroups are unavailable to that process for real, as on a cgroup-v2 host
NO_CGROUPS = (
    "import pathlib, sys\n"
    "import choir.sandbox._cgroups as cg\n"
    "cg._ROOT = pathlib.Path(sys.argv[1])\n"
    "from choir.cli import main\n"
    "sys.argv = ['choir', *sys.argv[2:]]\n"
    "main()\n"
)


@pytest.fixture
def no_cgroups(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process's cgroup root moved to a folder that does not exist, with a fresh pool
    (a pooled group pair made under the real root would otherwise still be handed out)."""
    missing = tmp_path / "no-cgroup-fs"
    monkeypatch.setattr(_cgroups, "_ROOT", missing)
    monkeypatch.setattr(_cgroups, "_POOL", None)
    return missing


def spec() -> VerifierSpec:
    return VerifierSpec(name="unit", kind=VerifierKind.UNIT_TESTS, limits=LIMITS,
                        steps=(StepSpec(name="a", command="true"),
                               StepSpec(name="b", command="echo ok > $CHOIR_OUT/ok")))


def run_and_attest(tmp_path: Path, sandbox_name: str, *, require_limits: bool = False,
                   ) -> tuple[dict[str, object], dict[str, object]]:
    """One real run of ``spec()``; returns (stored manifest JSON, attestation body JSON)."""
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    (repo / "mod.py").write_text("x = 1\n")
    os.chmod(repo, 0o755)
    store = ArtifactStore()
    target = Target(tree_hash=tree_hash(repo))
    sandbox = (isolated_backend(sandbox_name) if sandbox_name != "local"
               else get_sandbox("local"))
    sandbox.require_limits = require_limits  # as open_sandbox sets it for PARANOID
    try:
        run, result = asyncio.run(run_verifier_thread(
            spec(), repo=repo, target=target, sandbox=sandbox, store=store,
            run_id=f"r-{sandbox_name}"))
    finally:
        sandbox.close()
    assert result.status == "PASS", result.tail_log
    attestation = attest_run(run, spec(), store=store, signer=load_signer(),
                             attestations=AttestationStore(), policy_hash=None, mood="CALM")
    manifest = json.loads(store.read_bytes(result.manifest_hash))
    assert load_manifest(store, result.manifest_hash).platform.limits_applied is not None
    return manifest, attestation.body.model_dump(mode="json")


def assert_recorded(manifest: dict[str, object], body: dict[str, object],
                    expected: dict[str, object]) -> None:
    steps = manifest["commands_executed"]
    assert isinstance(steps, list) and len(steps) == 2
    for step in steps:
        assert step["limits_applied"] == expected
    platform = manifest["platform"]
    assert isinstance(platform, dict) and platform["limits_applied"] == expected
    environment = body["environment"]
    assert isinstance(environment, dict) and environment["limits_applied"] == expected


@pytest.mark.bwrap
@cgroups_writable
def test_bwrap_records_the_memory_pids_and_out_caps_it_applied(tmp_path: Path) -> None:
    manifest, body = run_and_attest(tmp_path, "bwrap", require_limits=True)
    assert_recorded(manifest, body, {"memory_mb": 300, "pids": 64, "cpus": None, "out_mb": 16})


@pytest.mark.bwrap
def test_bwrap_without_cgroups_records_memory_and_pids_as_null(tmp_path: Path,
                                                               no_cgroups: Path) -> None:
    manifest, body = run_and_attest(tmp_path, "bwrap")
    assert_recorded(manifest, body, {"memory_mb": None, "pids": None, "cpus": None,
                                     "out_mb": 16})
    assert not no_cgroups.exists()  # nothing was made in place of the cgroup filesystem


@pytest.mark.docker
def test_docker_records_the_limits_the_engine_kept(tmp_path: Path) -> None:
    # required limits, as under PARANOID: an engine that kept them runs the step
    manifest, body = run_and_attest(tmp_path, "docker", require_limits=True)
    assert_recorded(manifest, body, {"memory_mb": 300, "pids": 64, "cpus": 1.0, "out_mb": 16})


def test_local_records_only_the_out_cap(tmp_path: Path) -> None:
    manifest, body = run_and_attest(tmp_path, "local")
    assert_recorded(manifest, body, {"memory_mb": None, "pids": None, "cpus": None,
                                     "out_mb": 16})


def test_sandboxes_say_whether_they_can_enforce_limits(no_cgroups: Path) -> None:
    assert get_sandbox("local").limits_enforceable() is False
    assert get_sandbox("bwrap").limits_enforceable() is False  # cgroups unavailable here


@cgroups_writable
def test_bwrap_can_enforce_limits_where_cgroups_are_writable() -> None:
    assert get_sandbox("bwrap").limits_enforceable() is True


def choir_without_cgroups(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-c", NO_CGROUPS, str(tmp_path / "no-cgroup-fs"),
                           *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.bwrap
def test_paranoid_refuses_bwrap_without_cgroups_and_calm_still_runs(tmp_path: Path) -> None:
    isolated_backend("bwrap")
    repo = make_repo(tmp_path / "repo", CALC_OK)
    runs = Path(os.environ["CHOIR_ARTIFACT_DIR"]) / "runs"
    proc = choir_without_cgroups(tmp_path, "verify", "--repo", str(repo), "--sandbox", "bwrap",
                                 "--mood", "PARANOID")
    assert proc.returncode == 2, proc.stderr
    assert "requires resource limits" in proc.stderr and "Traceback" not in proc.stderr
    assert not runs.exists()  # refused before anything ran
    proc = choir_without_cgroups(tmp_path, "verify", "--repo", str(repo), "--sandbox", "bwrap",
                                 "--mood", "CALM", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "PASS"
    assert not (tmp_path / "no-cgroup-fs").exists()


def test_paranoid_policy_requires_limits() -> None:
    from choir.config.policy import load_packaged_policy

    packaged = load_packaged_policy()
    assert packaged.moods[Mood.PARANOID].require_limits is True
    assert packaged.moods[Mood.CALM].require_limits is False


@pytest.mark.bwrap
def test_a_bwrap_step_that_loses_its_cgroups_under_required_limits_is_inconclusive(
        tmp_path: Path, no_cgroups: Path) -> None:
    """The groups vanish between open_sandbox's check and the run: never a PASS without them."""
    repo = tmp_path / "repo"
    repo.mkdir()
    os.chmod(repo, 0o755)
    marker = tmp_path / "ran"
    sandbox = isolated_backend("bwrap")
    sandbox.require_limits = True  # as open_sandbox sets it for PARANOID
    one = VerifierSpec(name="unit", kind=VerifierKind.UNIT_TESTS, limits=LIMITS,
                       steps=(StepSpec(name="a", command=f"touch {marker}"),))
    try:
        run, result = asyncio.run(run_verifier_thread(
            one, repo=repo, target=Target(tree_hash="0" * 64), sandbox=sandbox,
            store=ArtifactStore(), run_id="r-lost"))
    finally:
        sandbox.close()
    assert result.status == "INCONCLUSIVE" and run.report.result is Result.INCONCLUSIVE
    assert result.infra_error is not None and "requires limits" in result.infra_error
    assert result.manifest.platform.limits_applied is None  # nothing ran, nothing enforced
    assert not marker.exists()


def test_bodies_without_the_record_keep_their_ids() -> None:
    """An environment minted before the field existed serialises as it did: same id."""
    from choir._core.canonical import canonical_json
    from choir.models import AppliedLimits, Environment, Platform

    env = Environment(sandbox="bwrap", isolation="namespace")
    assert "limits_applied" not in env.model_dump(mode="json")
    assert b"limits_applied" not in canonical_json(env)  # the bytes ids are computed from
    platform = Platform(os="linux", arch="x86_64", sandbox="local", isolation="none")
    assert "limits_applied" not in platform.model_dump(mode="json")
    recorded = Environment(sandbox="local", isolation="none",
                           limits_applied=AppliedLimits(out_mb=16))
    assert recorded.model_dump(mode="json")["limits_applied"] == {
        "memory_mb": None, "pids": None, "cpus": None, "out_mb": 16}  # null is explicit


def test_the_manifest_records_what_held_for_every_step() -> None:
    from choir.models import AppliedLimits

    full = AppliedLimits(memory_mb=300, pids=64, out_mb=16)
    partial = AppliedLimits(out_mb=16)
    assert AppliedLimits.weakest([full, full]) == full
    assert AppliedLimits.weakest([full, partial]) == partial  # one step without cgroups
    assert AppliedLimits.weakest([full, None]) == AppliedLimits()
    assert AppliedLimits.weakest([]) is None


def test_docker_records_null_for_a_limit_the_engine_dropped() -> None:
    """An engine on a kernel without a controller keeps the container but zeroes the limit
    (with only a warning): the record follows the inspected HostConfig, not the request."""
    from choir.sandbox.docker import engine_limits

    kept = engine_limits({"Memory": 300 * 1024 * 1024, "PidsLimit": 64,
                          "NanoCpus": 1_000_000_000}, LIMITS)
    assert kept.model_dump() == {"memory_mb": 300, "pids": 64, "cpus": 1.0, "out_mb": 16}
    dropped = engine_limits({"Memory": 0, "PidsLimit": None, "NanoCpus": 0}, LIMITS)
    assert dropped.model_dump() == {"memory_mb": None, "pids": None, "cpus": None,
                                    "out_mb": 16}
