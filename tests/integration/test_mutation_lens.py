"""The mutation lens in the real loop: a change the pinned tests do not test never ASSERTs.

The honest fix of ``add`` is killed on every mutant (``assert add(2, 3) == 5`` fails on
``a - b`` and on ``None``); the same fix plus an untested helper leaves mutants alive, which
BOLD and PARANOID both refuse (FAIL), naming the line. Mutants run in bwrap on
private copies of the sealed tree; the live tree is never touched.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from choir.attest import AttestationStore
from choir.evidence.artifacts import ArtifactStore
from choir.models import Mood, VerificationReport
from tests.specrepo import build_templates, run_item
from tests.workitems import FIXED

# mutants of real changes, each verified in a sandbox:
# CI's slow stage runs it, so that the README's command stays under five minutes
pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
              pytest.mark.slow]
HONEST = f"""
        Path("calc.py").write_text({FIXED!r})
        """
WITH_HELPER = FIXED + "def double(x):\n    return x * 2\n"
UNTESTED = f"""
        Path("calc.py").write_text({WITH_HELPER!r})
        """


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_templates(tmp_path_factory.mktemp("mutation-repos"))


def _mutation_reports(lens: str = "default") -> list[VerificationReport]:
    """The mutation checks' reports (``lens``: ``mutant`` for each mutant's own run)."""
    store = ArtifactStore()
    return [VerificationReport.model_validate_json(store.read_bytes(a.body.report_hash))
            for a in AttestationStore() if a.body.verifier == "unit.mutants"
            and (a.body.lens == "mutant") == (lens == "mutant")]


@pytest.mark.parametrize("mood", [Mood.BOLD, Mood.PARANOID])
def test_the_honest_fix_kills_every_mutant(tmp_path: Path, templates: dict[str, Path],
                                           mood: Mood) -> None:
    outcome, repo = run_item(tmp_path, templates["unit"], HONEST, mood)
    assert outcome.status == "asserted", outcome.events
    reports = _mutation_reports()
    assert reports and all(r.result.value == "PASS" for r in reports)
    assert reports[0].counts.run == 2 and reports[0].counts.failed == 0  # '+', return None
    assert (repo / "calc.py").read_text() == FIXED  # the live tree was never mutated
    mutant_runs = _mutation_reports("mutant")  # each attested on its own tree, a FAIL
    assert mutant_runs and all(r.result.value == "FAIL" for r in mutant_runs)
    assert all(r.target.tree_hash != reports[0].target.tree_hash for r in mutant_runs)
    from choir.audit.integrity import audit

    result = audit()
    assert result.ok, result.violations


@pytest.mark.parametrize("mood", [Mood.BOLD, Mood.PARANOID])
def test_an_untested_change_is_visible_and_never_asserted(
        tmp_path: Path, templates: dict[str, Path], mood: Mood) -> None:
    outcome, _repo = run_item(tmp_path, templates["unit"], UNTESTED, mood)
    assert outcome.status != "asserted", outcome.events
    reports = _mutation_reports()
    assert reports and {r.result.value for r in reports} == {"FAIL"}
    report = reports[0]
    assert "calc.py:4 '*' -> '/'" in report.summary, report.summary
    assert report.counts.failed == 3 and report.counts.run == 5  # 3 of double's survive
    # the evidence: one sealed sandboxed run per mutant, named in the report
    store = ArtifactStore()
    for digest in report.artifacts.values():
        manifest = json.loads(store.read_bytes(digest))
        assert manifest["platform"]["sandbox"] == "bwrap"
