"""A step's log counts against ``limits.out_mb``: stored cut with a marker, never a PASS on a
cut log unless a complete structured result (JUnit XML in ``$CHOIR_OUT``) decides.

The attack: with ``out_mb: 10`` a step printed gigabytes to stdout; every byte was stored as
its log and the verifier PASSed. Here 200 MB stands for the gigabytes, on every backend.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import tree_hash
from choir.models import Limits, StepSpec, Target, VerifierKind, VerifierSpec
from choir.sandbox import Sandbox, get_sandbox
from choir.verification import run_verifier_thread
from tests.sandboxes import ISOLATED, isolated_backend

CAP_MB = 10
SPEW = "yes choir | head -c 200000000"
JUNIT = ('<testsuite name="t" tests="1" failures="0" errors="0"><testcase classname="t" '
         'name="test_ok"/></testsuite>')


@pytest.fixture(params=[*ISOLATED, "local"])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "local":
        return get_sandbox("local")
    return isolated_backend(request.param)  # type: ignore[no-any-return]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    path.chmod(0o755)
    (path / "mod.py").write_text("x = 1\n")
    return path


def _verify(sandbox: Sandbox, repo: Path, command: str, *, parser: str = "generic",
            name: str = "spew") -> tuple[object, object]:
    spec = VerifierSpec(name=name, kind=VerifierKind.SMOKE, timeout_s=120, parser=parser,
                        limits=Limits(out_mb=CAP_MB),
                        steps=(StepSpec(name="spew", command=command),))
    try:
        return asyncio.run(run_verifier_thread(
            spec, repo=repo, target=Target(tree_hash=tree_hash(repo)), sandbox=sandbox,
            store=ArtifactStore(), run_id=f"{name}-{sandbox.name}"))
    finally:
        sandbox.close()


def _stored_log(result: object) -> bytes:
    store = ArtifactStore()
    digest = result.artifacts["logs/combined.log"]  # type: ignore[attr-defined]
    return store.path_of(digest).read_bytes()


def test_a_log_past_out_mb_is_cut_with_a_marker_and_never_passes(
    sandbox: Sandbox, repo: Path
) -> None:
    run, result = _verify(sandbox, repo, SPEW)
    log = _stored_log(result)
    assert len(log) <= CAP_MB * 1024 * 1024 + 4096, f"{len(log)} bytes stored"
    assert b"[choir] log cut" in log
    head, _, end = log.partition(b"\n[choir] log cut: ")
    assert head.startswith(b"choir\nchoir\n") and len(end) <= 64 * 1024 + 300
    assert end.endswith(b"choir\nch")  # 200,000,000 bytes of "choir\n": its real end
    record = result.manifest.commands_executed[0]  # type: ignore[attr-defined]
    assert record.exit_code == 0 and record.output_cut is not None
    assert record.output_cut >= 200_000_000 - CAP_MB * 1024 * 1024
    assert run.report.result.value == "INCONCLUSIVE"  # type: ignore[attr-defined]
    assert "log was cut" in run.report.summary  # type: ignore[attr-defined]


def test_a_cut_log_passes_when_complete_junit_decides(sandbox: Sandbox, repo: Path) -> None:
    run, result = _verify(sandbox, repo, f"{SPEW}; printf '%s' '{JUNIT}' > $CHOIR_OUT/junit.xml",
                          parser="junit", name="spew-junit")
    assert b"[choir] log cut" in _stored_log(result)
    assert run.report.result.value == "PASS"  # type: ignore[attr-defined]
    assert "log was cut" in run.report.summary  # type: ignore[attr-defined]


def test_a_failing_step_with_a_cut_log_still_fails(sandbox: Sandbox, repo: Path) -> None:
    run, _ = _verify(sandbox, repo, f"{SPEW}; exit 1", name="spew-fail")
    assert run.report.result.value == "FAIL"  # type: ignore[attr-defined]


def test_a_log_within_the_cap_is_stored_whole(sandbox: Sandbox, repo: Path) -> None:
    run, result = _verify(sandbox, repo, "yes choir | head -c 1000000", name="small")
    log = _stored_log(result)
    assert len(log) == 1_000_000 and b"[choir]" not in log
    assert result.manifest.commands_executed[0].output_cut is None  # type: ignore[attr-defined]
    assert run.report.result.value == "PASS"  # type: ignore[attr-defined]
