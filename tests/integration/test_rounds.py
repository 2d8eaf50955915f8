"""One plan runner (``choir.director.rounds``) for ``choir verify``, ``choir run``'s green
threads and the llm executor's gate: one run-id scheme, and every sealed run attested, also
when a thread beside it crashes. Real bubblewrap sandboxes, real artifact and attestation stores."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.bwrap

CHOIR_YAML = textwrap.dedent(
    """\
    verifiers:
      good:
        kind: smoke
        steps: [{name: run, command: "true"}]
      boom:
        kind: smoke
        steps: [{name: run, command: "true"}]
    """
)


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    if not shutil.which("bwrap"):
        if os.environ.get("CI"):
            pytest.fail("CI is set but bubblewrap is not installed")
        pytest.skip("bubblewrap is not installed")


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(CHOIR_YAML)
    (repo / "a.txt").write_text("under test\n")
    return repo


def _crash_boom(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verifier ``boom``'s run dies inside Choir (a fault, not a verdict)."""
    import choir.verification as verification

    real = verification.run_verifier

    def faulty(spec: Any, **kw: Any) -> Any:
        if spec.name == "boom":
            raise OSError("the disk went away")
        return real(spec, **kw)

    monkeypatch.setattr(verification, "run_verifier", faulty)


def test_a_crashed_thread_leaves_the_others_attested_and_the_session_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before one runner, ``choir verify`` raised when one verifier crashed, and the runs
    sealed beside it were never attested."""
    from choir.app.verify import verify_tree
    from choir.audit.integrity import audit
    from choir.models import Mood

    _crash_boom(monkeypatch)
    outcome = verify_tree(_repo(tmp_path), mood=Mood.SKEPTICAL, sandbox_name="bwrap")
    contract = outcome.contract
    results = {t["verifier"]: t["result"] for t in contract["threads"]}
    assert results == {"good": "PASS", "boom": "INCONCLUSIVE"}
    assert outcome.status == "FAIL"  # a crash never passes a session
    [good] = [t for t in contract["threads"] if t["verifier"] == "good"]
    [boom] = [t for t in contract["threads"] if t["verifier"] == "boom"]
    assert len(contract["attestations"]) == 1 and list(contract["manifest"]["runs"]) == [
        good["run_id"]]
    assert contract["manifest"]["crashed"] == [boom["run_id"]]
    assert "OSError" in next(r["summary"] for r in contract["reports"]
                             if r["verifier"] == "boom")
    result = audit()
    assert result.ok, result.violations


def test_a_session_that_hides_its_crash_is_caught_by_the_audit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from choir.app.verify import verify_tree
    from choir.audit.integrity import audit
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Mood

    _crash_boom(monkeypatch)
    outcome = verify_tree(_repo(tmp_path), mood=Mood.SKEPTICAL, sandbox_name="bwrap")
    path = ArtifactStore().run_dir(outcome.contract["run_id"]) / "manifest.json"
    data = json.loads(path.read_text())
    data["status"] = "PASS"  # every attested run passed; the crash is still listed
    path.chmod(0o644)
    path.write_text(json.dumps(data))
    kinds = {v.kind for v in audit().violations}
    assert "session_status" in kinds


def test_choir_verify_names_threads_by_the_one_scheme(tmp_path: Path) -> None:
    from choir._core.ids import thread_run_id
    from choir.app.verify import verify_tree
    from choir.models import Mood

    outcome = verify_tree(_repo(tmp_path), mood=Mood.SKEPTICAL, sandbox_name="bwrap")
    session = outcome.contract["run_id"]
    assert re.fullmatch(r"verify-\d{8}T\d{6}-[0-9a-f]{6}", session)
    assert sorted(t["run_id"] for t in outcome.contract["threads"]) == sorted(
        thread_run_id(session, name, 0) for name in ("good", "boom"))


def test_the_gate_runs_the_plan_through_the_runner_on_a_sealed_copy(
        tmp_path: Path) -> None:
    """The llm executor's gate: threads named ``{agent run}-check{hex}-{verifier}-0``,
    each attested with lens ``executor_gate``, verified on a sealed snapshot that is gone
    afterwards (before, it read the live tree)."""
    from choir.agent.executor import ChangeSummary, green_verifier
    from choir.attest import AttestationStore
    from choir.evidence.artifacts import ArtifactStore
    from choir.evidence.tree import snapshot_root
    from choir.models import Mood, WorkItem
    from choir.verification import load_manifest

    repo = _repo(tmp_path)
    item = WorkItem(id="w", goal="g", repo=str(repo), mood=Mood.SKEPTICAL)
    verify = green_verifier(item, "agentrun-exec1")
    out = asyncio.run(verify(ChangeSummary(summary="done")))
    assert out.summary == "done"
    atts = [AttestationStore().get(a) for a in AttestationStore().ids()]
    ids = sorted(a.body.run_id for a in atts)
    assert len(ids) == 2 and all(re.fullmatch(r"agentrun-exec1-check[0-9a-f]{8}-(good|boom)-0",
                                              i) for i in ids)
    assert {a.body.lens for a in atts} == {"executor_gate"}
    for att in atts:
        manifest = load_manifest(ArtifactStore(), att.body.manifest_hash)
        assert manifest.tree_hash == att.body.target.tree_hash
    assert not any(snapshot_root().glob("agentrun-exec1-check*"))  # removed after the check


def test_the_limiter_serves_a_fresh_event_loop(tmp_path: Path) -> None:
    """A semaphore keyed by a dead loop's ``id()`` can be handed to a new loop with the same
    id, which then refuses it; the limiter is keyed by the loop itself."""
    from choir.director.rounds import limiter

    async def use() -> None:
        async with limiter(1):
            await asyncio.sleep(0)

    for _ in range(20):
        asyncio.run(use())


async def test_a_choir_run_round_opens_one_backend_for_its_green_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each green thread is its own graph node; they share the round's sandbox and cluster
    client (before, every thread opened its own, and shipped the snapshot again)."""
    from choir.director.rounds import _SHARED, Backend
    from choir.graph.runner import run_work_item

    repo = _repo(tmp_path)
    (repo / "choir.yaml").write_text(CHOIR_YAML + textwrap.dedent("""\
          third:
            kind: smoke
            steps: [{name: run, command: "true"}]
        sandbox: {backend: bwrap}
        """))
    opened: list[Backend] = []
    real = Backend.open.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Backend], *args: Any, **kwargs: Any) -> Backend:
        backend = real(cls, *args, **kwargs)
        opened.append(backend)
        return backend

    monkeypatch.setattr(Backend, "open", classmethod(counting))
    item = tmp_path / "item.yaml"
    item.write_text("id: shared\ngoal: g\nrepo: ./repo\nmood: SKEPTICAL\n"
                    "executor: {kind: command, command: 'true'}\n")
    out = await run_work_item(item, run_id="shared-run")
    assert out.status == "asserted", out
    assert len(opened) == 1  # one round of three green threads
    assert all(not held for held in _SHARED.values())  # released: nothing left open


def test_choir_runs_show_names_a_crashed_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from choir.app.verify import verify_tree
    from choir.cli.runs import show_command
    from choir.models import Mood

    _crash_boom(monkeypatch)
    outcome = verify_tree(_repo(tmp_path), mood=Mood.SKEPTICAL, sandbox_name="bwrap")
    [crashed] = outcome.contract["manifest"]["crashed"]
    shown = CliRunner().invoke(show_command, [outcome.contract["run_id"]])
    assert shown.exit_code == 0, shown.output
    assert f"{crashed}: crashed inside Choir" in shown.output
    assert "FAIL" in shown.output.splitlines()[0]
