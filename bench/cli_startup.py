"""`choir --help` and `import choir` against a bare `python -c pass`, side by side.

python bench/cli_startup.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def median_ms(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    py = sys.executable
    cases = {
        "python -c pass (bare)": [py, "-c", "pass"],
        "python -c 'import choir'": [py, "-c", "import choir"],
        "choir --help": [py, "-m", "choir", "--help"],
        "python -c 'import choir.models'": [py, "-c", "import choir.models"],
    }
    bare = None
    print(f"{'case':36} {'median ms':>10} {'vs bare':>8}")
    for name, argv in cases.items():
        ms = median_ms(argv, runs)
        bare = bare or ms
        print(f"{name:36} {ms:10.1f} {ms / bare:7.2f}x")


if __name__ == "__main__":
    main()
