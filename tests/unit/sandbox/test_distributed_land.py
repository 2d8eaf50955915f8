"""A worker's returned run is hashed again where it lands: tampered bytes never become evidence.

The run is real (the ``local`` sandbox, a real artifact store on the "worker" side); the
attacks alter what travels back, as a compromised worker or a broken transport would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.app.verify import resolve_target
from choir.distributed.remote_run import RemoteRun, land
from choir.evidence.artifacts import ArtifactStore
from choir.exceptions import IntegrityError
from choir.models import StepSpec, VerifierKind, VerifierSpec
from choir.sandbox import get_sandbox
from choir.verification.pipeline import run_verifier

SPEC = VerifierSpec(name="echo", kind=VerifierKind.SMOKE,
                    steps=(StepSpec(name="say", command="echo evidence; "
                                    "echo kept > $CHOIR_OUT/result.txt"),))


@pytest.fixture
def worker_run(tmp_path: Path) -> tuple[RemoteRun, Path]:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    store = ArtifactStore(tmp_path / "worker-store")
    result = run_verifier(SPEC, repo=repo, sandbox=get_sandbox("local"), store=store,
                          run_id="r-1", target=resolve_target(repo))
    base = store.run_dir("r-1")
    remote = RemoteRun(run_id="r-1", manifest_json=(base / "manifest.json").read_bytes(),
                       manifest_hash=result.manifest_hash,
                       files={rel: (base / rel).read_bytes() for rel in result.manifest.files})
    assert set(remote.files) == {"logs/combined.log", "logs/step-01-say.log",
                                 "out/result.txt"}
    return remote, repo


def test_an_honest_run_lands_with_every_file_rehashed(worker_run: tuple[RemoteRun, Path],
                                                      tmp_path: Path) -> None:
    remote, repo = worker_run
    store = ArtifactStore(tmp_path / "coordinator")
    result = land(remote, store=store, spec=SPEC, target=resolve_target(repo))
    assert result.status == "PASS" and result.manifest_hash == remote.manifest_hash
    assert "evidence" in result.tail_log
    assert all(store.verify(digest) for digest in result.manifest.files.values())
    assert (store.run_dir("r-1") / "out" / "result.txt").read_text() == "kept\n"
    # landing the same run again (a resumed thread) changes nothing
    assert land(remote, store=store, spec=SPEC,
                target=resolve_target(repo)).manifest_hash == remote.manifest_hash


@pytest.mark.parametrize("attack", ["altered_byte", "extra_file", "missing_file",
                                    "dotdot_name", "other_tree", "other_manifest"])
def test_a_tampered_return_is_refused_and_nothing_is_stored(
        worker_run: tuple[RemoteRun, Path], tmp_path: Path, attack: str) -> None:
    remote, repo = worker_run
    files = dict(remote.files)
    fields: dict[str, object] = {}
    if attack == "altered_byte":
        files["out/result.txt"] = b"forged\n"
    elif attack == "extra_file":
        files["out/planted"] = b"x"
    elif attack == "missing_file":
        del files["logs/step-01-say.log"]
    elif attack == "dotdot_name":
        files["../../escaped"] = files.pop("out/result.txt")
    elif attack == "other_tree":
        (repo / "a.txt").write_text("changed\n")  # the coordinator's target is another tree
    elif attack == "other_manifest":
        fields["manifest_json"] = remote.manifest_json.replace(b'"PASS"', b'"FAIL"')
    forged = remote.model_copy(update={"files": files, **fields})
    store = ArtifactStore(tmp_path / "coordinator")
    with pytest.raises(IntegrityError):
        land(forged, store=store, spec=SPEC, target=resolve_target(repo))
    assert not store.run_dir("r-1").exists()
    assert not (tmp_path / "coordinator" / "escaped").exists()


def test_a_worker_run_of_other_steps_does_not_land_as_this_verifier(
        worker_run: tuple[RemoteRun, Path], tmp_path: Path) -> None:
    """An honest, well-hashed run of other commands under this verifier's name (a worker
    with another configuration) is not a result of this verifier's steps."""
    remote, repo = worker_run
    stricter = SPEC.model_copy(update={"steps": (*SPEC.steps,
                                                 StepSpec(name="check", command="false"))})
    store = ArtifactStore(tmp_path / "coordinator")
    with pytest.raises(IntegrityError, match="other steps"):
        land(remote, store=store, spec=stricter, target=resolve_target(repo))
    assert not store.run_dir("r-1").exists()
