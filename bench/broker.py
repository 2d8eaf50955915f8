"""What the signing broker costs: one signature, its start, and ``choir verify``'s fixed cost.

    python bench/broker.py [--signs 2000] [--runs 7]

Three measurements, each against the bare equivalent in the same run:

- a signature of an AHDB head (the most frequent request) through the broker against the
  same key signing in this process (median of ``--signs``); an attestation body is timed
  too, since the broker re-hashes the report and manifest it cites before signing;
- starting the broker and confining a process (``choir.trusted.separate``) in a fresh
  interpreter, against that interpreter doing nothing;
- ``choir verify`` on a one-step repo (``true``, local sandbox: no sandbox cost to hide the
  fixed cost), as the CLI runs it (broker and confinement), against the same command with the
  key loaded in-process and no confinement, as before the broker (``--runs``, interleaved).

Everything lives in a temporary folder that is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the command as it ran before the broker: the key loaded in this process, nothing hidden
IN_PROCESS = """
import choir.attest.keys as keys
from choir.trusted.keyfile import load_key
from choir._core.paths import choir_home
import choir.cli
keys.broker_signer = lambda home=None: load_key(home or choir_home())
choir.cli._separate = lambda args: None
choir.cli.main()  # the process entry point, as `python -m choir` runs it
"""

BROKER_IMPORTS = "import choir.trusted, choir.trusted.broker, choir.trusted.confine"
SEPARATE = BROKER_IMPORTS + "; print(choir.trusted.separate())"


def _timed(fn: object, n: int) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def signatures(home: Path, n: int) -> None:
    from choir._core.canonical import canonical_json
    from choir.trusted import signer
    from choir.trusted.keyfile import load_key

    head = canonical_json({"type": "choir.ahdb-head/v1", "seq": 7, "head": "ab" * 32})
    local, broker = load_key(home), signer(home)
    bare = _timed(lambda: local.sign(head), n)
    through = _timed(lambda: broker.sign(head), n)
    print(f"{'head signature, in-process':44} {bare:9.1f} us")
    print(f"{'head signature, through the broker':44} {through:9.1f} us  "
          f"(+{through - bare:.1f} us, {through / bare:.1f}x)")
    body = _attestation_body(home)
    bare_att = _timed(lambda: local.sign(body), n // 10)
    through_att = _timed(lambda: broker.sign(body), n // 10)
    print(f"{'attestation signature, in-process':44} {bare_att:9.1f} us")
    print(f"{'attestation signature, through the broker':44} {through_att:9.1f} us  "
          f"(+{through_att - bare_att:.1f} us, {len(body)} bytes)")


def _attestation_body(home: Path) -> bytes:
    from datetime import UTC, datetime

    from choir._core.canonical import canonical_json
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import AttestationBody, Environment, Result, Target

    store = ArtifactStore()
    report = store.ingest_bytes(b'{"report": "' + b"x" * 4000 + b'"}')
    manifest = store.ingest_bytes(b'{"manifest": "' + b"y" * 2000 + b'"}')
    now = datetime.now(UTC)
    body = AttestationBody(run_id="bench", verifier="unit", verifier_kind="unit_tests",
                           verifier_version="1", verifier_config_hash="c" * 64,
                           commands=("pytest -q",),
                           target=Target(work_item="wi", tree_hash="d" * 64),
                           result=Result.PASS, report_hash=report, manifest_hash=manifest,
                           environment=Environment(sandbox="local", isolation="none"),
                           started_at=now, ended_at=now)
    return canonical_json(body)


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user+sys of the reaped process tree) milliseconds of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0,):
        raise SystemExit(f"{argv[:4]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed * 1000, cpu * 1000


def _wall(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    return _run(argv, cwd, env)[0]


def startup(tmp: Path, env: dict[str, str], runs: int) -> None:
    bare, sep = [], []
    for _ in range(runs):  # the same imports either way: only the fork, key and mounts differ
        bare.append(_wall([sys.executable, "-c", BROKER_IMPORTS], tmp, env))
        sep.append(_wall([sys.executable, "-c", SEPARATE], tmp, env))
    b, s = statistics.median(bare), statistics.median(sep)
    print(f"{'python -c import choir.trusted.broker':44} {b:9.1f} ms")
    print(f"{'... + separate() (fork, key, namespace)':44} {s:9.1f} ms  (+{s - b:.1f} ms)")


def verify(tmp: Path, env: dict[str, str], runs: int) -> None:
    repo = tmp / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(
        "verifiers:\n  unit:\n    kind: lint\n    steps:\n      - name: t\n"
        "        command: 'true'\nsandbox: {backend: local}\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    args = ["verify", "--repo", str(repo), "--json"]
    cases = {"in-process key (before)": [sys.executable, "-c", IN_PROCESS, *args],
             "broker + confinement (now)": [sys.executable, "-m", "choir", *args]}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for argv in cases.values():  # warm-up: bytecode, page cache, the key
        _wall(argv, tmp, env)
    for _ in range(runs):
        for name, argv in cases.items():
            times[name].append(_run(argv, tmp, env))
    base = times["in-process key (before)"]
    wall0, cpu0 = (statistics.median(x[i] for x in base) for i in (0, 1))
    for name, samples in times.items():
        wall, cpu = (statistics.median(x[i] for x in samples) for i in (0, 1))
        print(f"{'choir verify, ' + name:44} {wall:9.1f} ms  (+{wall - wall0:.1f} ms, min "
              f"{min(x[0] for x in samples):.1f}); cpu {cpu:.1f} ms (+{cpu - cpu0:.1f})")
    # runs are interleaved, so each pair saw the same load: the median of the differences
    pairs = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(base, times["broker + confinement (now)"],
                                                        strict=True)]
    print(f"{'median of paired differences (now - before)':44} "
          f"{statistics.median(p[0] for p in pairs):9.1f} ms wall, "
          f"{statistics.median(p[1] for p in pairs):.1f} ms cpu")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--signs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="choir-bench-broker-") as raw:
        tmp = Path(raw)
        home = tmp / "home"
        env = dict(os.environ, CHOIR_HOME=str(home), CHOIR_ARTIFACT_DIR=str(home / "artifacts"))
        os.environ.update(CHOIR_HOME=str(home), CHOIR_ARTIFACT_DIR=str(home / "artifacts"))
        signatures(home, opts.signs)
        startup(tmp, env, opts.runs)
        verify(tmp, env, opts.runs)
        from choir.trusted import close_all

        close_all()


if __name__ == "__main__":
    main()
