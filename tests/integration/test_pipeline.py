"""The seed-001 pipeline: ordered steps, first failure stops, timeouts fail, logs sealed."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.models import Limits, StepSpec, Target, VerifierKind, VerifierSpec
from choir.sandbox import ExecResult, Sandbox, get_sandbox
from choir.verification.pipeline import TAIL_LINE_MAX, TAIL_LINES, run_verifier
from tests.evidence import make_repo


def spec(*commands: str, timeout_s: float = 30) -> VerifierSpec:
    return VerifierSpec(name="v", kind=VerifierKind.BUILD, timeout_s=timeout_s,
                        steps=tuple(StepSpec(name=f"s{i}", command=c)
                                    for i, c in enumerate(commands, 1)))


def go(tmp_path: Path, s: VerifierSpec, sandbox: Sandbox | None = None, run_id: str = "r1"):  # type: ignore[no-untyped-def]
    repo = make_repo(tmp_path / "repo")
    return run_verifier(s, repo=repo, sandbox=sandbox or get_sandbox("local"),
                        store=ArtifactStore(), run_id=run_id,
                        target=Target(tree_hash="0" * 64))


def test_steps_run_in_order_and_stop_at_first_failure(tmp_path: Path) -> None:
    res = go(tmp_path, spec("echo one", "echo two; exit 3", "echo three"))
    assert res.status == "FAIL"
    assert [(c.name, c.exit_code) for c in res.manifest.commands_executed] == [("s1", 0),
                                                                              ("s2", 3)]
    combined = (res.run_dir / "logs/combined.log").read_text()
    assert "one" in combined and "two" in combined and "three" not in combined
    assert (res.run_dir / "logs/step-01-s1.log").read_text() == "one\n"
    assert (res.run_dir / "logs/step-02-s2.log").read_text() == "two\n"
    assert not (res.run_dir / "logs/step-03-s3.log").exists()


def test_timeout_is_a_fail_not_a_retry(tmp_path: Path) -> None:
    start = time.monotonic()
    res = go(tmp_path, spec("sleep 100", "echo never", timeout_s=1))
    assert res.status == "FAIL" and time.monotonic() - start < 6
    assert res.manifest.commands_executed[-1].timed_out
    assert len(res.manifest.commands_executed) == 1


class _Broken(Sandbox):
    isolation = "namespace"
    name = "broken"

    def exec(self, command: str, *, repo: Path, out_dir: Path, env: Mapping[str, str],
             timeout_s: float, limits: Limits, network: bool, sink) -> ExecResult:  # type: ignore[no-untyped-def]
        return ExecResult(-1, 0, infra_error="engine went away")


def test_sandbox_failure_is_inconclusive_not_fail(tmp_path: Path) -> None:
    res = go(tmp_path, spec("true"), sandbox=_Broken())
    assert res.status == "INCONCLUSIVE" and res.infra_error == "engine went away"
    assert res.manifest.infra_error == "engine went away"


def test_tail_is_bounded_and_marks_truncation(tmp_path: Path) -> None:
    res = go(tmp_path, spec("seq 1 5000; head -c 100000 /dev/zero | tr '\\0' x; echo"))
    lines = res.tail_log.splitlines()
    assert len(lines) <= TAIL_LINES
    assert lines[-1].startswith("x" * 100) and "line truncated" in lines[-1]
    assert len(lines[-1]) < TAIL_LINE_MAX + 100
    # the full log is stored whole
    assert (res.run_dir / "logs/step-01-s1.log").stat().st_size > 100000


def test_temporaries_go_under_choir_out_and_every_file_is_sealed(tmp_path: Path) -> None:
    res = go(tmp_path, spec('echo "$TMPDIR $HOME"; test -d "$TMPDIR"; '
                            'echo data > "$CHOIR_OUT/report.json"'))
    assert res.status == "PASS"
    out = (res.run_dir / "logs/combined.log").read_text()
    assert f"{res.run_dir}/out/tmp" in out
    manifest = json.loads((res.run_dir / "manifest.json").read_text())
    assert set(manifest["files"]) == {"logs/combined.log", "logs/step-01-s1.log",
                                      "out/report.json"}
    assert ArtifactStore().exists(res.manifest_hash)
    assert manifest["platform"]["isolation"] == "none"


def test_bad_run_id_is_refused(tmp_path: Path) -> None:
    from choir.exceptions import UserError

    with pytest.raises(UserError):
        go(tmp_path, spec("true"), run_id="../escape")
