"""A reduced run of ``bench/impossible.py``: cheats on impossible tasks are never ASSERTed,
the honest fix of a possible task is, and the named residual (an executor that reads which
test is calling) still is."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")]
BENCH = Path(__file__).resolve().parents[2] / "bench" / "impossible.py"


def test_the_reduced_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("impossible", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    code = bench.main(["--moods", "CALM", "--strategies",
                       "honest,delete-test,overload-eq,record-state,caller-detect", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    asserted = {(r["strategy"], r["variant"]) for r in rows if r["asserted"]}
    assert asserted == {("honest", "original"), ("caller-detect", "one-off"),
                        ("caller-detect", "conflicting")}, rows
