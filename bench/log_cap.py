"""What capping a step's log costs: a 200 MB stdout under ``out_mb: 10`` against the same
run with the cap above it (``out_mb: 4096``, stored whole), through ``run_verifier``.

    python bench/log_cap.py [--sandbox bwrap] [--rounds 3]

Two outputs: 200 MB of 6-byte lines (``yes choir``: the line-heavy worst case for the tail
kept for people) and 200 MB of zero bytes (few lines). Rounds interleave capped and
uncapped runs; medians are printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

OUTPUTS = {"lines": "yes choir | head -c 200000000", "zeros": "head -c 200000000 /dev/zero"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="choir-bench-logcap-")
    os.environ["CHOIR_HOME"] = home
    os.environ["CHOIR_ARTIFACT_DIR"] = f"{home}/artifacts"
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Limits, StepSpec, Target, VerifierKind, VerifierSpec
    from choir.sandbox import get_sandbox
    from choir.verification.pipeline import run_verifier

    repo = Path(home) / "repo"
    repo.mkdir()
    os.chmod(home, 0o755)
    sandbox = get_sandbox(args.sandbox)
    times: dict[tuple[str, int], list[float]] = {}
    try:
        for number in range(args.rounds):
            for kind, command in OUTPUTS.items():
                for cap in (4096, 10):
                    spec = VerifierSpec(name="b", kind=VerifierKind.SMOKE, timeout_s=300,
                                        limits=Limits(out_mb=cap),
                                        steps=(StepSpec(name="s", command=command),))
                    start = time.perf_counter()
                    run_verifier(spec, repo=repo, sandbox=sandbox, store=ArtifactStore(),
                                 run_id=f"{kind}-{cap}-{number}",
                                 target=Target(tree_hash="0" * 64))
                    times.setdefault((kind, cap), []).append(time.perf_counter() - start)
                    shutil.rmtree(f"{home}/artifacts")  # keep the disk use to one run
        for kind in OUTPUTS:
            whole = statistics.median(times[(kind, 4096)])
            capped = statistics.median(times[(kind, 10)])
            print(f"{args.sandbox} {kind}: stored whole {whole:.2f} s, capped at 10 MiB "
                  f"{capped:.2f} s ({capped / whole:.2f}x)")
    finally:
        sandbox.close()
        shutil.rmtree(home)


if __name__ == "__main__":
    main()
