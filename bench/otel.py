"""What OpenTelemetry costs: ``choir verify`` with it off and on, ``import choir`` against a
base checkout, and one no-op hook.

    python bench/otel.py [--runs 7] [--base-src /path/to/main] [--sandbox bwrap]

- ``verify``: a two-verifier repo (one prints a line, one runs ``true``) verified by the real
  CLI, interleaved, off (no variable, no flag) and on (``--otel``, exported over OTLP/HTTP
  to a receiver on 127.0.0.1 that this script runs); median wall seconds and the ratio.
  The receiver must have received every session's spans.
- ``import choir``: ``python -c "import choir"`` with this checkout and with ``--base-src``
  (an older checkout's source first on ``PYTHONPATH``), interleaved, median of ``--runs * 3``.
- ``hook``: one ``with span(...)`` while off, in nanoseconds (``timeit``), beside an empty
  ``with nullcontext()``.

Nothing is left behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _repo(path: Path, sandbox: str) -> Path:
    path.mkdir()
    py = os.path.realpath(sys.executable)
    (path / "loud.py").write_text("print('hello')\n")
    (path / "choir.yaml").write_text(
        "verifiers:\n"
        f"  loud: {{kind: unit_tests, steps: [{{name: shout, command: {py} loud.py}}]}}\n"
        "  quiet: {kind: unit_tests, steps: [{name: ok, command: 'true'}]}\n"
        f"sandbox: {{backend: {sandbox}}}\n")
    return path


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return took


def bench_verify(runs: int, sandbox: str) -> None:
    from tests.otelspans import Receiver

    with tempfile.TemporaryDirectory(prefix="choir-bench-otel-") as tmp, Receiver() as receiver:
        base = dict(os.environ, CHOIR_HOME=f"{tmp}/home", CHOIR_ARTIFACT_DIR=f"{tmp}/art",
                    TMPDIR=tmp)
        base.pop("CHOIR_OTEL", None)
        repo = _repo(Path(tmp) / "repo", sandbox)
        cmd = [sys.executable, "-m", "choir", "verify", "--repo", str(repo), "--json"]
        on_env = {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        _timed(cmd, base)  # warm-up: keys, trust pins, caches
        off, on = [], []
        for _ in range(runs):
            off.append(_timed(cmd, base))
            on.append(_timed([*cmd, "--otel"], on_env))
        sessions = sum(1 for _, s in receiver.spans() if s.name == "choir.verify")
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"verify off  median {m_off:.3f} s  {[round(x, 3) for x in off]}")
    print(f"verify on   median {m_on:.3f} s  {[round(x, 3) for x in on]}")
    print(f"verify on/off ratio {m_on / m_off:.3f}  (sessions exported: {sessions}/{runs})")


def bench_import(runs: int, base_src: str | None) -> None:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    rows: dict[str, list[float]] = {"this": []}
    if base_src:
        rows["base"] = []
    cmd = [sys.executable, "-c", "import choir"]
    for _ in range(runs * 3):
        rows["this"].append(_timed(cmd, env))
        if base_src:
            rows["base"].append(_timed(cmd, {**env, "PYTHONPATH": base_src}))
    for name, times in rows.items():
        print(f"import choir ({name})  median {statistics.median(times) * 1000:.1f} ms")
    if base_src:
        ratio = statistics.median(rows["this"]) / statistics.median(rows["base"])
        print(f"import choir this/base ratio {ratio:.3f}")
    leaked = subprocess.run(
        [sys.executable, "-c", "import sys, choir, choir.telemetry; "
                               "print(sum(m.startswith('opentelemetry') for m in sys.modules))"],
        capture_output=True, text=True, env=env, check=True).stdout.strip()
    print(f"opentelemetry modules after `import choir, choir.telemetry`: {leaked}")


def bench_hook() -> None:
    from contextlib import nullcontext

    from choir.telemetry import span

    n = 1_000_000

    def hooked() -> None:
        with span("choir.green_thread", {"choir.verdict": "PASS"}) as tel:
            tel.set({"choir.report_hash": "x"})

    def bare() -> None:
        with nullcontext():
            pass

    per_hook = min(timeit.repeat(hooked, number=n, repeat=3)) / n * 1e9
    per_bare = min(timeit.repeat(bare, number=n, repeat=3)) / n * 1e9
    print(f"hook off: {per_hook:.0f} ns per span (with set); empty nullcontext: {per_bare:.0f} ns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--base-src", default=None,
                        help="an older checkout's root (its choir/ is imported instead)")
    parser.add_argument("--sandbox", default="bwrap" if shutil.which("bwrap") else "local")
    args = parser.parse_args()
    bench_hook()
    bench_import(args.runs, args.base_src)
    bench_verify(args.runs, args.sandbox)


if __name__ == "__main__":
    main()
