"""A worker's returned run is hashed again where it lands: tampered bytes never become evidence.

The run is real (the ``local`` sandbox, a real artifact store on the "worker" side); the
attacks alter what travels back, as a compromised worker or a broken transport would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from choir._core.canonical import blake3_hex, canonical_json
from choir.distributed.pki import ClusterPKI, Role, sign_as
from choir.distributed.remote_run import RemoteRun, land, signed_bytes
from choir.distributed.worker import seal_for_coordinator
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.target import resolve_target
from choir.exceptions import IntegrityError
from choir.models import RunManifest, StepSpec, VerifierKind, VerifierSpec
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


def test_an_answer_for_another_run_id_is_refused_and_nothing_is_stored(
        worker_run: tuple[RemoteRun, Path], tmp_path: Path) -> None:
    """Review 23c F3: a worker asked for one run answered with a run sealed under another
    id (a sibling replica's); it landed under that id."""
    remote, repo = worker_run
    store = ArtifactStore(tmp_path / "coordinator")
    with pytest.raises(IntegrityError, match="not the run asked for"):
        land(remote, store=store, spec=SPEC, target=resolve_target(repo), run_id="r-2")
    assert store.sealed("r-1") is None and store.sealed("r-2") is None
    assert not (store.root / "runs").exists() or not any((store.root / "runs").iterdir())


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


def _signed(remote: RemoteRun, pki: ClusterPKI, role: Role = "worker",
            name: str = "w0") -> RemoteRun:
    """``remote`` as worker ``name`` of ``pki`` sends it: its manifest naming it, signed."""
    manifest = RunManifest.model_validate_json(remote.manifest_json)
    return seal_for_coordinator(remote.run_id, manifest, dict(remote.files),
                                pki.issue(role, name))


def _check(remote: RemoteRun, pki: ClusterPKI, repo: Path, store: ArtifactStore) -> object:
    """What the coordinator does with an answer: who signed it, then land it as theirs."""
    worker = pki.verify_signed(remote.worker_cert, remote.signature,
                               signed_bytes(remote.run_id, remote.manifest_hash), "worker")
    return land(remote, store=store, spec=SPEC, target=resolve_target(repo), worker=worker)


def test_a_signed_run_lands_naming_its_worker(worker_run: tuple[RemoteRun, Path],
                                              tmp_path: Path) -> None:
    remote, repo = worker_run
    pki = ClusterPKI(tmp_path / "ca")
    store = ArtifactStore(tmp_path / "coordinator")
    result = _check(_signed(remote, pki), pki, repo, store)
    assert result.manifest.platform.worker == "w0"  # type: ignore[attr-defined]
    assert result.manifest.platform.worker_cert.startswith("sha256:")  # type: ignore[attr-defined]
    assert result.status == "PASS"  # type: ignore[attr-defined]


@pytest.mark.parametrize("attack", ["other_ca", "client_cert", "edited_after_signing",
                                    "names_another_worker", "unsigned"])
def test_a_run_not_signed_by_a_worker_of_this_ca_is_refused(
        worker_run: tuple[RemoteRun, Path], tmp_path: Path, attack: str) -> None:
    remote, repo = worker_run
    pki = ClusterPKI(tmp_path / "ca")
    pki.ensure()
    forged = _signed(remote, pki)
    if attack == "other_ca":  # a worker certificate of another cluster (Choir's own tooling)
        forged = _signed(remote, ClusterPKI(tmp_path / "other"))
    elif attack == "client_cert":  # the coordinator's own role cannot pose as a worker
        forged = _signed(remote, pki, role="client", name="w0")
    elif attack == "edited_after_signing":  # the manifest changed, its hash recomputed
        manifest = RunManifest.model_validate_json(forged.manifest_json)
        edited = canonical_json(manifest.model_copy(update={"bytes_logged": 0}))
        forged = forged.model_copy(update={"manifest_json": edited,
                                           "manifest_hash": blake3_hex(edited)})
    elif attack == "names_another_worker":  # w1 signs a manifest that names w0
        named = _signed(remote, pki, name="w0")
        w1 = pki.issue("worker", "w1")
        cert, signature = sign_as(w1, signed_bytes(remote.run_id, named.manifest_hash))
        forged = named.model_copy(update={"worker_cert": cert, "signature": signature})
    elif attack == "unsigned":
        forged = remote
    store = ArtifactStore(tmp_path / "coordinator")
    with pytest.raises(IntegrityError):
        _check(forged, pki, repo, store)
    assert not store.run_dir("r-1").exists()


def test_the_cluster_files_are_the_owners_alone(tmp_path: Path) -> None:
    import os
    import stat

    from choir.exceptions import UserError

    pki = ClusterPKI(tmp_path / "ca")
    files = pki.issue("worker", "w0")
    for folder in (pki.directory, files.cert.parent):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    for key in (pki.directory / "ca.key", files.key):
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    # a key planted as a link is never followed, a folder opened to others is refused
    (files.cert.parent / "w1.key").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(IntegrityError, match="exists already"):
        pki.issue("worker", "w1")
    assert not (tmp_path / "elsewhere").exists()
    os.chmod(pki.directory, 0o755)
    with pytest.raises(UserError, match="chmod 700"):
        pki.issue("worker", "w2")


def test_the_pki_command_makes_the_files_or_exits_2(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from choir.distributed.pki import main

    assert main(["init"]) == 0
    made = capsys.readouterr().out.split()
    assert [Path(p).name for p in made[1:]] == ["ca.pem", "scheduler.pem", "scheduler.key",
                                                "coordinator.pem", "coordinator.key"]
    assert main(["issue", "worker", "../escape"]) == 2
    assert "the name letters" in capsys.readouterr().out


def test_a_name_returned_as_both_file_and_folder_is_refused_before_anything_is_written(
        worker_run: tuple[RemoteRun, Path], tmp_path: Path) -> None:
    """Review 16's suspicion: ``out/result.txt`` and ``out/result.txt/x`` both listed (by a
    manifest the worker made to match) raised NotADirectoryError half-way through the
    writes, leaving an unsealed run folder behind."""
    remote, repo = worker_run
    manifest = RunManifest.model_validate_json(remote.manifest_json)
    files = {**remote.files, "out/result.txt/x": b"y"}
    manifest = manifest.model_copy(update={"files": {**manifest.files,
                                                     "out/result.txt/x": blake3_hex(b"y")}})
    manifest_json = canonical_json(manifest)
    forged = remote.model_copy(update={"files": files, "manifest_json": manifest_json,
                                       "manifest_hash": blake3_hex(manifest_json)})
    store = ArtifactStore(tmp_path / "coordinator")
    with pytest.raises(IntegrityError, match="both as a file and as a folder"):
        land(forged, store=store, spec=SPEC, target=resolve_target(repo))
    assert not store.run_dir("r-1").exists()
