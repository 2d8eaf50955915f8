"""A claim recorded by a verify round needs every verifier it is required to have: a plan
item checked whole on its integration head (its parts merged) was ASSERTed by whatever its
mood planned, its own ``required_verifiers`` aside (a review's suspicion, shown here)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from choir.ahdb import open_ahdb
from choir.app.verify import averify_tree
from choir.exceptions import UserError
from choir.models import Mood
from tests.team import git
from tests.workitems import JUNIT, PYTEST

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def _repo(path: Path, integ_passes: bool) -> Path:
    path.mkdir()
    (path / "test_unit.py").write_text("def test_ok():\n    assert True\n")
    (path / "test_integ.py").write_text(f"def test_together():\n    assert {integ_passes}\n")
    (path / "choir.yaml").write_text(
        "sandbox: {backend: bwrap}\nverifiers:\n"
        f"  unit: {{kind: unit_tests, steps: [{{name: t, command: '{PYTEST} test_unit.py "
        f"{JUNIT}'}}], parser: junit}}\n"
        f"  integ: {{kind: integration_tests, steps: [{{name: t, command: '{PYTEST} "
        f"test_integ.py {JUNIT}'}}], parser: junit}}\n")
    git(path, "init", "-q", "-b", "main")
    return path


def _verify(repo: Path, claim: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    return asyncio.run(averify_tree(repo, mood=Mood.CALM, claim=claim,
                                    required=required)).contract


def test_a_required_verifier_runs_whatever_the_mood_plans_and_gates_the_claim(
        tmp_path: Path) -> None:
    good = _repo(tmp_path / "good", integ_passes=True)
    plain = _verify(good, "plain")
    assert [t["verifier"] for t in plain["threads"]] == ["unit"]  # CALM plans unit tests only
    done = _verify(good, "whole", ("integ",))
    assert sorted(t["verifier"] for t in done["threads"]) == ["integ", "unit"]
    assert done["claim"]["asserted"] is not None
    asserted = open_ahdb().is_asserted("whole", done["manifest"]["tree_hash"])
    assert asserted is not None
    bad = _repo(tmp_path / "bad", integ_passes=False)
    refused = _verify(bad, "whole-bad", ("integ",))
    assert refused["status"] == "FAIL" and refused["claim"]["asserted"] is None
    assert open_ahdb().is_asserted("whole-bad", refused["manifest"]["tree_hash"]) is None
    with pytest.raises(UserError, match="not in choir.yaml"):
        _verify(good, "unknown", ("lint",))


def test_a_split_items_whole_check_requires_the_items_own_verifiers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's whole check hands the item's ``required_verifiers`` to the round."""
    import choir.team.queue as queue
    from choir.models.plan import PlanRecord, PlanRow
    from choir.team.driver import Driver
    from choir.team.plan import Plan, PlanItem
    from choir.team.queue import Verdict

    seen: dict[str, Any] = {}

    async def fake(path: Path, claim: str, tree: str, what: str, session: str,
                   mood: Mood | None = None, required: tuple[str, ...] = ()) -> Verdict:
        seen.update(claim=claim, mood=mood, required=required)
        return Verdict(True, "whole PASS", 0.0)

    monkeypatch.setattr(queue, "verify_tree", fake)
    plan = Plan(id="sp", items=(PlanItem(id="it", goal="g", mood=Mood.SKEPTICAL,
                                         required_verifiers=("unit", "integ")),))
    driver = Driver.__new__(Driver)
    driver.plan, driver.trees = plan, tmp_path / "trees"
    record = PlanRecord.model_construct(items={"it": PlanRow.model_construct(
        whole_tree="t" * 64, whole_session="verify-x", part=None)})
    asyncio.run(driver._whole("it", "h" * 40, record))
    assert seen == {"claim": "sp.it", "mood": Mood.SKEPTICAL, "required": ("unit", "integ")}
