"""Report size against raw log size (the context the main loop is spared), and parse time/MB.

python bench/report_size.py [--max-mb 100] [--lines error|short]

``--lines error`` (the default): every line an error line of ~100 bytes, each one a candidate
for the generic parser; ``short``: six-byte lines with no error word (the log-cap test's
shape, where reading line by line costs the most per byte).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-mb", type=int, default=100)
    parser.add_argument("--lines", choices=("error", "short"), default="error")
    args = parser.parse_args()
    max_mb = args.max_mb
    home = Path(tempfile.mkdtemp())
    os.environ["CHOIR_HOME"] = str(home)
    os.environ["CHOIR_ARTIFACT_DIR"] = str(home / "artifacts")
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import StepSpec, Target, VerifierKind, VerifierSpec
    from choir.report.build import abuild_report, parse_run
    from choir.sandbox import get_sandbox
    from choir.verification.pipeline import run_verifier

    repo = home / "repo"
    repo.mkdir()
    store, sandbox = ArtifactStore(), get_sandbox("local")
    sizes = [1 << 10, 1 << 20, 10 << 20] + ([max_mb << 20] if max_mb > 10 else [])
    print(
        f"{'log bytes':>12} {'report bytes':>13} {'ratio':>10} {'parse s':>8} {'parse ms/MB':>11}"
    )
    for size in sizes:
        line = ("ERROR test_%d failed at 0x7f00 in /tmp/x/mod.py:12 after 0.31s " + "x" * 40
                if args.lines == "error" else "c%04d")
        script = home / f"spew{size}.py"
        script.write_text(
            f"import sys\nn = {size} // {len(line) + 1}\nw = sys.stdout.write\n"
            f"for i in range(n): w({line!r} % i + '\\n')\nsys.exit(1)\n"
        )
        spec = VerifierSpec(
            name="spew",
            kind=VerifierKind.SMOKE,
            timeout_s=600,
            steps=(StepSpec(name="spew", command=f"python3 {script}"),),
        )
        target = Target(tree_hash="0" * 64)
        result = run_verifier(
            spec, repo=repo, sandbox=sandbox, store=store, run_id=f"size-{size}", target=target
        )
        start = time.perf_counter()
        parse_run(result, spec, store)
        parse_s = time.perf_counter() - start
        report = asyncio.run(abuild_report(result, spec=spec, store=store, target=target))
        logged = result.manifest.bytes_logged
        rsize = len(json.dumps(report.model_dump(mode="json")))
        print(
            f"{logged:12d} {rsize:13d} {logged / rsize:9.0f}x {parse_s:8.2f} "
            f"{parse_s * 1000 / max(logged / 2**20, 1e-9):11.0f}"
        )


if __name__ == "__main__":
    main()
