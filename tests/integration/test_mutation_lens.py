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
    mutant_runs = _mutation_reports("mutant")  # each attested on its own tree
    # the null mutant (a no-op line added) passes as the tree did; both real ones fail
    assert sorted(r.result.value for r in mutant_runs) == (
        ["FAIL", "FAIL"] * len(reports) + ["PASS"] * len(reports))
    assert all(r.target.tree_hash != reports[0].target.tree_hash for r in mutant_runs)
    from choir.audit.integrity import audit

    result = audit()
    assert result.ok, result.violations


def _never_asserted(tmp_path: Path, templates: dict[str, Path], body: str, mood: Mood,
                    result: str) -> VerificationReport:
    """Run the item whose executor writes ``body``; it must not end ASSERTed, and every
    mutation report must say ``result``: the first one."""
    outcome, _repo = run_item(tmp_path, templates["unit"], body, mood)
    assert outcome.status != "asserted", outcome.events
    reports = _mutation_reports()
    assert reports and {r.result.value for r in reports} == {result}
    return reports[0]


@pytest.mark.parametrize("mood", [Mood.BOLD, Mood.PARANOID])
def test_an_untested_change_is_visible_and_never_asserted(
        tmp_path: Path, templates: dict[str, Path], mood: Mood) -> None:
    report = _never_asserted(tmp_path, templates, UNTESTED, mood, "FAIL")
    assert "calc.py:4 '*' -> '/'" in report.summary, report.summary
    assert report.counts.failed == 3 and report.counts.run == 5  # 3 of double's survive
    # the evidence: one sealed sandboxed run per mutant, named in the report
    store = ArtifactStore()
    for digest in report.artifacts.values():
        manifest = json.loads(store.read_bytes(digest))
        assert manifest["platform"]["sandbox"] == "bwrap"


def _self_hashing(body: str) -> str:
    """``body`` behind a guard that refuses to import once its text differs from the tree's
    (review 22a, F1): every mutant fails at import, whatever the tests test."""
    import hashlib

    digest = hashlib.sha256(body.encode()).hexdigest()
    return ("import hashlib as _h\n"
            "if _h.sha256(open(__file__, 'rb').read().partition(b'#END\\n')[2]).hexdigest()"
            f" != {digest!r}:\n    raise ImportError('not the tree')\n#END\n" + body)


SELF_HASHING = f"""
        Path("calc.py").write_text({_self_hashing(WITH_HELPER)!r})
        """


@pytest.mark.parametrize("mood", [Mood.BOLD, Mood.PARANOID])
def test_code_that_tells_a_mutant_from_the_tree_is_never_asserted(
        tmp_path: Path, templates: dict[str, Path], mood: Mood) -> None:
    report = _never_asserted(tmp_path, templates, SELF_HASHING, mood, "INCONCLUSIVE")
    assert "tells a mutant from the tree" in report.summary, report.summary
