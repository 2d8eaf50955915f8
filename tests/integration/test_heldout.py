"""Held-out checks: tests the executor never sees catch the cheats the pinned tests cannot.

The spec tests' repo (``add`` subtracts; ``assert add(2, 3) == 5`` pinned) plus a user's
``heldout.yaml`` naming a hidden test outside the repo. The real loop runs a scripted
``command`` executor in bubblewrap and the verifiers in bwrap sandboxes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.app.gate import check_gate
from choir.app.verify import verify_tree
from choir.attest import AttestationStore
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import tree_hash
from choir.models import Mood, VerificationReport
from tests.heldoutrepo import EQ_OVERLOAD, HARD_CODED, MARKER, home, write_heldout
from tests.sandboxes import ISOLATED, isolated_backend
from tests.specrepo import build_templates, run_item
from tests.workitems import FIXED

# cheating executors through whole runs under every mood:
# CI's slow stage runs it, so that the README's command stays under five minutes
pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
              pytest.mark.slow]
HONEST = f"""
        Path("calc.py").write_text({FIXED!r})
        """


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_templates(tmp_path_factory.mktemp("heldout-repos"))


@pytest.mark.parametrize("mood", [Mood.CALM, Mood.PARANOID])
@pytest.mark.parametrize("cheat", ["eq-overload", "hard-coded"])
def test_cheats_that_fit_the_visible_tests_fail_the_heldout_check(
        tmp_path: Path, templates: dict[str, Path], cheat: str, mood: Mood) -> None:
    """Without the held-out check both cheats are ASSERTed (the pinned test passes: watched
    on the code before held-out checks existed); with it, never."""
    write_heldout(home(), tmp_path / "repo")
    body = EQ_OVERLOAD if cheat == "eq-overload" else HARD_CODED
    outcome, repo = run_item(tmp_path, templates["unit"], body, mood)
    assert outcome.status != "asserted", outcome.events
    assert open_ahdb().is_asserted("fix-add", tree_hash(repo)) is None
    [att] = [a for a in AttestationStore() if a.body.verifier == "hidden"][:1]
    assert att.body.result.value == "FAIL"
    assert att.body.heldout and len(att.body.heldout) == 64


def test_without_heldout_checks_the_eq_overload_is_asserted(
        tmp_path: Path, templates: dict[str, Path]) -> None:
    """The residual the held-out check closes: the pinned test alone passes the cheat."""
    outcome, _repo = run_item(tmp_path, templates["unit"], EQ_OVERLOAD, Mood.CALM)
    assert outcome.status == "asserted", outcome.events


@pytest.mark.parametrize("mood", [Mood.CALM, Mood.SKEPTICAL, Mood.PARANOID, Mood.BOLD])
def test_the_honest_fix_passes_the_heldout_check(tmp_path: Path, templates: dict[str, Path],
                                                 mood: Mood) -> None:
    write_heldout(home(), tmp_path / "repo")
    outcome, repo = run_item(tmp_path, templates["unit"], HONEST, mood)
    assert outcome.status == "asserted", outcome.events
    hidden = [a for a in AttestationStore() if a.body.verifier == "hidden"]
    assert hidden and all(a.body.result.value == "PASS" and a.body.heldout for a in hidden)
    assert check_gate("fix-add", tree=tree_hash(repo), commit=None).passed
    from choir.audit.integrity import audit

    result = audit()
    assert result.ok, result.violations


SNOOP = f"""
        import json, os
        found = {{"env": [k for k, v in os.environ.items() if "heldout" in (k + v).lower()
                         or "choir-home" in v],
                 "listed": {{}}, "read": [], "hits": []}}
        for where in os.environ.get("SNOOP_PATHS", "").split(":"):
            try:
                found["listed"][where] = os.listdir(where)
            except OSError as exc:
                found["listed"][where] = str(exc)
            try:
                found["read"].append(Path(where, "test_hidden.py").read_text())
            except OSError:
                pass
        for root in ("/", ):
            for dirpath, dirs, names in os.walk(root):
                dirs[:] = [d for d in dirs if not (dirpath == "/" and d in ("proc", "sys",
                                                                            "dev", "usr"))]
                for name in names:
                    p = os.path.join(dirpath, name)
                    if name.startswith("test_hidden") or name == "heldout.yaml":
                        found["hits"].append(p)
                        continue
                    try:
                        marker = "-".join({MARKER.split("-")!r}).encode()
                        if os.path.getsize(p) < 65536 and marker in open(p, "rb").read():
                            found["hits"].append(p)
                    except OSError:
                        pass
        Path("snooped.json").write_text(json.dumps(found))
        """


@pytest.mark.parametrize("where", ["home", "outside"])
def test_the_executor_can_neither_read_nor_list_nor_find_the_heldout_checks(
        tmp_path: Path, templates: dict[str, Path], where: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In CHOIR_HOME or at an absolute folder beside the repo (both in the folder the
    executor's sandbox binds): masked. The executor walks every file it can see for the
    hidden test's name and text, and looks in its environment."""
    folder = tmp_path / "private-checks" if where == "outside" else None
    held = write_heldout(home(), tmp_path / "repo", folder)
    monkeypatch.setenv("SNOOP_PATHS", f"{home()}:{held}:{home() / 'heldout'}")
    _outcome, repo = run_item(tmp_path, templates["unit"], SNOOP, Mood.CALM)
    found = json.loads((repo / "snooped.json").read_text())
    assert found["read"] == [] and found["hits"] == [], found
    # nothing names them but what the test itself handed in (and pytest's own test name)
    assert set(found["env"]) <= {"SNOOP_PATHS", "PYTEST_CURRENT_TEST"}, found
    for path, listing in found["listed"].items():  # empty masks (another mask's mount point)
        assert isinstance(listing, str) or set(listing) <= {"artifacts"}, (path, listing)


FEEDBACK = f"""
        import os, shutil
        if os.environ["CHOIR_ATTEMPT"] == "1":
            Path("calc.py").write_text({HARD_CODED.split("write_text(")[1].rsplit(")", 1)[0]
                                        .strip()})
        else:
            shutil.copy(os.environ["CHOIR_FEEDBACK_FILE"], "feedback.json")
        """


def test_the_executor_hears_counts_only_while_the_person_keeps_the_full_report(
        tmp_path: Path, templates: dict[str, Path]) -> None:
    write_heldout(home(), tmp_path / "repo")
    outcome, repo = run_item(tmp_path, templates["unit"], FEEDBACK, Mood.CALM, attempts=2)
    text = (repo / "feedback.json").read_text()
    reports = [VerificationReport.model_validate(r) for r in json.loads(text)]
    [hidden] = [r for r in reports if r.verifier == "hidden"]
    assert hidden.result.value == "FAIL"
    assert hidden.failure_signatures == () and hidden.artifacts == {}
    assert hidden.summary == "held-out check FAIL" and hidden.counts.run is None
    for leak in ("test_hidden", "plain_int", MARKER, "type(got)", "assert"):
        assert leak not in text, leak
    # the person's record keeps everything: the attested report names the failing test
    store = ArtifactStore()
    full = [VerificationReport.model_validate_json(store.read_bytes(a.body.report_hash))
            for a in AttestationStore() if a.body.verifier == "hidden"]
    assert any("test_hidden_sum_is_a_plain_int" in (s.test_id or "")
               for r in full for s in r.failure_signatures), full
    assert outcome.status != "asserted"


CHECK = """\
import os
import sys

sys.path.insert(0, os.getcwd())
from calc import add

for path in (os.path.join(os.environ["CHOIR_HELDOUT"], "planted"), "planted"):
    try:
        open(path, "w").close()
    except OSError:
        continue
    print("writable:", path)
    sys.exit(3)
sys.exit(0 if add(2, 3) == 5 else 1)
"""


@pytest.mark.parametrize("name", ISOLATED)
def test_a_heldout_check_reads_its_files_read_only_in_each_sandbox(
        tmp_path: Path, choir_home: Path, name: str) -> None:
    """``choir verify`` in bwrap and in Docker: the held-out files and the repo are readable
    and read-only to the check; it judges the code like any verifier."""
    isolated_backend(name).close()
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "choir.yaml").write_text(
        "verifiers:\n  smoke:\n    kind: smoke\n    steps: [{name: s, command: 'true'}]\n")
    folder = choir_home / "heldout" / "check"
    folder.mkdir(parents=True)
    (folder / "check.py").write_text(CHECK)
    (choir_home / "heldout.yaml").write_text(
        f"repos:\n  - repo: {repo}\n    verifiers:\n      hidden:\n        kind: smoke\n"
        f"        path: check\n        steps:\n          - name: check\n"
        f"            command: python3 $CHOIR_HELDOUT/check.py\n")
    buggy = verify_tree(repo, sandbox_name=name, mood=Mood.CALM)
    assert not buggy.passed
    [hidden] = [r for r in buggy.contract["reports"] if r["verifier"] == "hidden"]
    assert hidden["result"] == "FAIL"
    assert (repo / "calc.py").write_text(FIXED)
    fixed = verify_tree(repo, sandbox_name=name, mood=Mood.CALM)
    assert fixed.passed, fixed.contract["reports"]
    assert not (repo / "planted").exists()
