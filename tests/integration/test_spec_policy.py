"""Spec changes by policy: ``may_change_spec`` additions, refusals, a person's approval.

The same repo and loop as the attack tests (``test_spec_attacks.py``): ``add`` subtracts,
the executor fixes it and touches the tests as each case says. Additions the work item
declares run beside the pinned checks; a change to a pinned check is refused (CALM) or held
for a person with the diff attached (PARANOID), and every attestation names the pin.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from choir.app.gate import check_gate
from choir.attest import AttestationStore
from choir.evidence.tree import tree_hash
from choir.graph.runner import approve
from choir.models import Mood
from tests import forked
from tests.specrepo import build_templates, run_item, write_item
from tests.workitems import FIXED, PY

# whole runs (plans of several items; spec changes under every mood): CI's slow stage runs
# them, so that the README's command stays under five minutes
pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
              pytest.mark.slow]


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_templates(tmp_path_factory.mktemp("spec-repos"))

FIX = f"Path('calc.py').write_text({FIXED!r})\n"


def _add_test(path: str, expr: str) -> str:
    return FIX + f"Path({path!r}).write_text('from calc import add\\n\\ndef test_more():\\n" \
                 f"    assert {expr}\\n')\n"


def _attestations() -> list:  # type: ignore[type-arg]
    return list(AttestationStore())


def _gate_open(repo: Path) -> bool:
    return check_gate("fix-add", tree=tree_hash(repo), commit=None).passed


@pytest.mark.parametrize(("expr", "asserted"), [("add(2, 2) == 4", True),
                                                ("add(2, 2) == 5", False)])
def test_a_declared_addition_runs_beside_the_pinned_checks(
        tmp_path: Path, templates: dict[str, Path], expr: str, asserted: bool) -> None:
    outcome, repo = run_item(tmp_path, templates["unit"], _add_test("tests/test_more.py", expr),
                             Mood.CALM, extra="may_change_spec: [tests/test_more.py]\n")
    assert (outcome.status == "asserted") is asserted, outcome.events
    assert _gate_open(repo) is asserted
    # the pinned check alone, and beside the addition: only the second can see it fail
    first = [a for a in _attestations() if "-r0-" in a.body.run_id]  # later: other lenses
    alone, beside = sorted(first, key=lambda a: a.body.run_id.endswith("-1000"))
    assert alone.body.result.value == "PASS" and beside.body.run_id.endswith("-unit-1000")
    assert beside.body.result.value == ("PASS" if asserted else "FAIL")
    change = beside.body.spec_change
    assert beside.body.spec_hash and change is not None and change == alone.body.spec_change
    assert change.added == ("tests/test_more.py",) and not change.refused
    assert change.tree_hash == beside.body.target.tree_hash
    assert change.view_hash and change.additions_view and change.view_hash != \
        change.additions_view


@pytest.mark.parametrize("where", ["test_more.py", "conftest.py"])
def test_an_undeclared_addition_is_refused_even_when_the_code_is_right(
        tmp_path: Path, templates: dict[str, Path], where: str) -> None:
    """Not run, and the tree that holds it is never ASSERTed; a conftest.py is never an
    addition, even where may_change_spec names it."""
    outcome, repo = run_item(tmp_path, templates["unit"], _add_test(where, "True"), Mood.CALM,
                             extra="may_change_spec: [conftest.py]\n")
    assert outcome.status == "halted" and "spec change refused" in outcome.reason
    assert not _gate_open(repo)
    [att] = _attestations()  # the pinned check ran, and passed: the refusal is the spec's
    assert att.body.result.value == "PASS"
    assert att.body.spec_change is not None and att.body.spec_change.refused == (where,)


STRENGTHEN = FIX + ("p = Path('tests/test_calc.py')\n"
                    "p.write_text(p.read_text() + '    assert add(0, 0) == 0\\n')\n")
DECLARED = "may_change_spec: [tests/test_calc.py]\n"


def test_a_declared_change_to_a_pinned_check_is_refused_in_calm(
        tmp_path: Path, templates: dict[str, Path]) -> None:
    outcome, repo = run_item(tmp_path, templates["unit"], STRENGTHEN, Mood.CALM, extra=DECLARED)
    assert outcome.status == "halted" and "modified tests/test_calc.py" in outcome.reason
    assert "add(0, 0)" in (repo / "tests" / "test_calc.py").read_text()  # it was writable
    assert not _gate_open(repo)


@pytest.mark.parametrize("answer", ["approve", "reject"])
def test_a_declared_change_waits_for_a_person_in_paranoid(
        tmp_path: Path, templates: dict[str, Path], answer: str) -> None:
    outcome, repo = run_item(tmp_path, templates["unit"], STRENGTHEN, Mood.PARANOID,
                             extra=DECLARED)
    assert outcome.status == "awaiting_approval" and outcome.waiting, outcome.events
    assert any("held for a person" in e for e in outcome.events)
    assert "+    assert add(0, 0) == 0" in outcome.question["diff"]  # the diff, for the person
    assert outcome.question["spec_change"]["held"] == ["tests/test_calc.py"]
    assert not _attestations() and not _gate_open(repo)  # nothing verified before the answer
    done = asyncio.run(approve(outcome.run_id, reject=answer == "reject"))
    if answer == "reject":
        assert done.status == "rejected" and not _attestations()
        assert not _gate_open(repo)
        return
    assert done.status == "asserted", done.events
    assert _gate_open(repo)
    # the verified tree's attestations (a mutation check's mutants are attested on their own)
    change = next(a for a in _attestations() if a.body.lens != "mutant").body.spec_change
    assert change is not None and change.approved and change.held == ("tests/test_calc.py",)
    assert change.diff is not None


def test_a_declared_new_conftest_waits_for_a_person_in_paranoid(
        tmp_path: Path, templates: dict[str, Path]) -> None:
    """A new conftest.py is never an addition; inside ``may_change_spec`` under a mood that
    holds changes it is held like an edited check, shown whole, and runs once approved."""
    plant = FIX + "Path('tests/conftest.py').write_text('SEEN = 1\\n')\n"
    outcome, repo = run_item(tmp_path, templates["unit"], plant, Mood.PARANOID,
                             extra="may_change_spec: [tests/conftest.py]\n")
    assert outcome.status == "awaiting_approval", outcome.events
    assert outcome.question["spec_change"]["held"] == ["tests/conftest.py"]
    assert any("new test configuration tests/conftest.py" in e for e in outcome.events)
    assert outcome.question["diff"] == \
        "--- /dev/null\n+++ b/tests/conftest.py\n@@ -0,0 +1 @@\n+SEEN = 1\n"
    assert not _attestations() and not _gate_open(repo)
    done = asyncio.run(approve(outcome.run_id))
    assert done.status == "asserted", done.events
    change = next(a for a in _attestations() if a.body.lens != "mutant").body.spec_change
    assert change is not None and change.approved and change.held == ("tests/conftest.py",)


def test_a_declared_addition_cannot_stand_in_for_a_pinned_check(
        tmp_path: Path, templates: dict[str, Path]) -> None:
    """A new test module runs in the same pytest process as the pinned tests: one that
    patches the code under test at import would make the pinned test pass. The pinned checks
    are run without the additions too, so the patch shows as disagreement, never a PASS."""
    patch = ("Path('tests/test_a_first.py').write_text('import calc\\n"
             "calc.add = lambda a, b: a + b\\n\\ndef test_more():\\n    assert True\\n')\n")
    outcome, repo = run_item(tmp_path, templates["unit"], patch, Mood.CALM,
                             extra="may_change_spec: [tests/test_a_first.py]\n")
    assert "a - b" in (repo / "calc.py").read_text()
    assert outcome.status != "asserted", outcome.events
    assert not _gate_open(repo)


@pytest.mark.parametrize("mood", [Mood.CALM, Mood.SKEPTICAL])
def test_an_addition_cannot_stand_in_by_making_the_pinned_view_inconclusive(
        tmp_path: Path, templates: dict[str, Path], mood: Mood) -> None:
    """Review 17, F5: the code under test exits 127 when the addition is missing, so the
    pinned checks alone are INCONCLUSIVE (a tool missing, evidence of nothing), and the
    PASS beside the patching addition decided alone: the buggy tree was ASSERTed."""
    patch = ("Path('tests/test_a_first.py').write_text('import calc\\n"
             "calc.add = lambda a, b: a + b\\n\\ndef test_more():\\n    assert True\\n')\n"
             "src = Path('calc.py').read_text()\n"
             "Path('calc.py').write_text('import os\\n'\n"
             "    'if not os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)),"
             " \"tests\", \"test_a_first.py\")):\\n'\n"
             "    '    os._exit(127)\\n' + src)\n")
    outcome, repo = run_item(tmp_path, templates["unit"], patch, mood,
                             extra="may_change_spec: [tests/test_a_first.py]\n")
    assert "a - b" in (repo / "calc.py").read_text()
    assert "os._exit(127)" in (repo / "calc.py").read_text()
    assert outcome.status != "asserted", outcome.events
    assert not _gate_open(repo)


def test_the_cli_shows_the_held_diff_and_a_fresh_process_approves_it(
        tmp_path: Path, templates: dict[str, Path]) -> None:
    """Exit 3 with the diff on stdout; ``choir approve`` resumes the checkpoint (the held
    change and the pin) in a new process and ASSERTs."""
    item, repo = write_item(tmp_path, templates["unit"], STRENGTHEN, extra=DECLARED)
    run = forked.run([PY, "-m", "choir", "run", str(item), "--mood", "PARANOID",
                      "--run-id", "held"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "+    assert add(0, 0) == 0" in run.stdout and "choir approve held" in run.stdout
    done = forked.run([PY, "-m", "choir", "approve", "held"], capture_output=True,
                      text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _gate_open(repo)
    # review 16c: a second answer re-drove the finished run and printed its old status
    again = forked.run([PY, "-m", "choir", "approve", "held"], capture_output=True,
                       text=True, timeout=300)
    assert again.returncode == 2 and "not waiting for approval" in again.stderr, again.stderr
