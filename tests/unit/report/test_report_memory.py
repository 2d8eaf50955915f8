"""A log with one enormous line is parsed in bounded windows (issue #11 item 14).

A verifier can print a gigabyte without a newline. Every parser reads its logs in windows
of bounded size, so the report costs the same memory whatever the line length. Measured in
a child process (VmHWM, see tests/memory.py) around a real run in the local sandbox.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.memory import PEAK_RSS

PARSERS = ("generic", "pytest", "junit", "mypy", "ruff", "sarif")


def _peak_growth_kib(tmp_path, mib: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Run a verifier printing ``mib`` MiB on one line, then build its report with every
    parser; returns KiB of peak RSS growth over the child's state after imports."""
    script = PEAK_RSS + textwrap.dedent(f"""
        import asyncio, json, os, sys
        os.environ["CHOIR_HOME"] = {str(tmp_path / "home")!r}
        from pathlib import Path
        from choir.evidence.artifacts import ArtifactStore
        from choir.models import StepSpec, Target, VerifierKind, VerifierSpec
        from choir.verification.pipeline import run_verifier
        from choir.report import abuild_report
        from choir.sandbox import get_sandbox
        repo = Path({str(tmp_path)!r})
        store = ArtifactStore(repo / "store")
        target = Target(tree_hash="0" * 64)
        command = ({sys.executable!r} + " -c \\"import sys; w = sys.stdout.buffer.write; "
                   "[w(b'error x' * 149797) for _ in range({mib})]; sys.exit(1)\\"")
        spec = VerifierSpec(name="v", kind=VerifierKind.UNIT_TESTS, timeout_s=300,
                            steps=(StepSpec(name="run", command=command),))
        base = peak_rss_kib()
        result = run_verifier(spec, repo=repo, sandbox=get_sandbox("local"), store=store,
                              run_id="big", target=target)
        assert result.manifest.bytes_logged >= {mib} << 20, result.manifest.bytes_logged
        growth = {{"run": peak_rss_kib() - base}}
        for parser in {PARSERS!r}:
            report = asyncio.run(abuild_report(result, spec=spec.model_copy(
                update={{"parser": parser}}), store=store, target=target))
            assert report.result.value in ("FAIL", "INCONCLUSIVE"), report
            growth[parser] = peak_rss_kib() - base
        print(json.dumps(growth))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _check(growth: dict[str, int]) -> None:
    print("peak RSS growth, KiB:", growth)
    for name, kib in growth.items():
        assert kib < 24 * 1024, (name, growth)  # windows are ~1 MiB; 24 MiB is generous


def test_a_64_mib_single_line_log_is_parsed_in_bounded_memory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _check(_peak_growth_kib(tmp_path, 64))


@pytest.mark.slow
def test_a_1_gib_single_line_log_is_parsed_in_bounded_memory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _check(_peak_growth_kib(tmp_path, 1024))
