"""The verified work-item loop as a node in a user's own StateGraph (the map-reduce example,
run for real: two work items fanned out with Send, each in its own bwrap sandbox)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from tests.team import team_repo

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
EXAMPLE = Path(__file__).parents[2] / "examples" / "team" / "map_reduce.py"


def test_the_map_reduce_example_collects_one_verified_outcome_per_work_item(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("map_reduce_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, example)  # its TypedDicts resolve there
    spec.loader.exec_module(example)
    repos = [team_repo(tmp_path / "one"), team_repo(tmp_path / "two")]
    out = example.main(repos, tmp_path)
    by_item = {o["work_item"]: o for o in out["outcomes"]}
    assert set(by_item) == {"good", "bad"}, out  # both runs came back to the parent
    assert by_item["good"]["status"] == "asserted" and by_item["good"]["asserted"]
    assert by_item["bad"]["status"] != "asserted"
    assert out["verified"] == ["good"]
    assert (tmp_path / "one" / "a.txt").read_text() == "A\n"  # the loop ran in the repo
