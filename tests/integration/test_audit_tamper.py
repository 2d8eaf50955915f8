"""Change any stored byte behind Choir's back and ``choir audit`` fails, naming it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from choir.ahdb import event_hash, open_ahdb
from choir.evidence.tree import tree_hash
from choir.models import AtomKind, AtomStatus
from tests import forked
from tests.evidence import attest, make_repo


def audit() -> tuple[int, dict]:  # type: ignore[type-arg]
    proc = forked.run([sys.executable, "-m", "choir", "audit", "--json"],
                      capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def clean_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A clean store, made once for the module: one PASS run promoted and ASSERTed, one FAIL
    run hypothesized, and ``choir audit`` finding nothing in it."""
    import tempfile

    made = tmp_path_factory.mktemp("world")
    home, private = made / "choir-home", made / "tmp"
    home.mkdir()
    private.mkdir()
    with pytest.MonkeyPatch.context() as mp:  # what ``choir_home`` gives a test
        mp.setenv("CHOIR_HOME", str(home))
        mp.setenv("CHOIR_ARTIFACT_DIR", str(home / "artifacts"))
        mp.setenv("CHOIR_SEEN_HEADS", str(made / "seen-heads"))
        mp.setenv("TMPDIR", str(private))
        mp.setattr(tempfile, "tempdir", str(private))
        repo = make_repo(made / "repo")
        ok = attest(repo, "unit", "echo all good; true")
        bad = attest(repo, "lint", "echo broken; false")
        db = open_ahdb()
        claim = db.propose(claim="unit passes", work_item="wi", tree_hash=tree_hash(repo),
                           required_verifiers=["unit"])
        claim = db.promote(claim.id, [ok.id])
        db.assert_work_item("wi", tree_hash(repo), references=[claim.id], claim="done")
        db.hypothesize("wi", tree_hash(repo), claim="lint fails",
                       discriminating_test="run lint", attestation_ids=[bad.id])
        assert audit()[0] == 0
    return {"home": home, "ok": ok, "repo": repo}


@pytest.fixture
def world(clean_world: dict[str, object], tmp_path: Path,
          choir_home: Path) -> dict[str, object]:
    """This test's own copy of the clean store (``cp -a``: modes, and the hard links between
    run files and stored objects, as they were), in its own CHOIR_HOME and repo.

    Making the store costs two verifier runs, a signer and a cold ``choir audit``; nothing in
    it names the folder it is in (``test_a_copy_of_the_clean_world_audits_clean``)."""
    choir_home.rmdir()  # the autouse fixture's empty home: the copy takes its place
    repo = tmp_path / "repo"
    for source, target in ((clean_world["home"], choir_home), (clean_world["repo"], repo)):
        subprocess.run(["cp", "-a", str(source), str(target)], check=True)
    return {"home": choir_home, "ok": clean_world["ok"], "repo": repo, "db": open_ahdb()}


def test_a_copy_of_the_clean_world_audits_clean(world: dict[str, object]) -> None:
    """What every tampering below starts from: the copy, untouched, is a clean store."""
    assert audit()[0] == 0


def _flip(path: Path) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _artifacts(home: Path) -> Path:
    return home / "artifacts"


TAMPERS: dict[str, tuple[Callable[[dict[str, object]], None], str]] = {}


def tamper(kind: str) -> Callable[[Callable[[dict[str, object]], None]], None]:
    def register(fn: Callable[[dict[str, object]], None]) -> None:
        TAMPERS[fn.__name__] = (fn, kind)

    return register


@tamper("artifact_hash")
def stored_object(w: dict[str, object]) -> None:
    home = w["home"]
    assert isinstance(home, Path)
    obj = next(p for p in (_artifacts(home) / "objects").rglob("*") if p.is_file())
    _flip(obj)


@tamper("run_file_hash")
def run_log(w: dict[str, object]) -> None:
    home = w["home"]
    assert isinstance(home, Path)
    log = next((_artifacts(home) / "runs").glob("*-unit/logs/combined.log"))
    # break the hard link first so only the run file changes, not the object
    data = log.read_bytes()
    log.unlink()
    log.write_bytes(data.replace(b"all good", b"all gold"))


@tamper("run_extra_file")
def planted_file(w: dict[str, object]) -> None:
    home = w["home"]
    assert isinstance(home, Path)
    run = next((_artifacts(home) / "runs").glob("*-unit"))
    os.chmod(run / "logs", 0o755)
    (run / "logs" / "extra.log").write_text("PASS")


@tamper("run_unattested")
def manifest(w: dict[str, object]) -> None:
    home = w["home"]
    assert isinstance(home, Path)
    path = next((_artifacts(home) / "runs").glob("*-unit/manifest.json"))
    os.chmod(path, 0o644)
    path.write_text(path.read_text().replace('"PASS"', '"FAIL"'))


@tamper("object_hash")
def report(w: dict[str, object]) -> None:
    home, ok = w["home"], w["ok"]
    assert isinstance(home, Path)
    digest = ok.body.report_hash  # type: ignore[attr-defined]
    path = _artifacts(home) / "objects" / digest[:2] / digest[2:]
    os.chmod(path, 0o644)
    path.write_text(path.read_text().replace('"PASS"', '"FAIL"'))


@tamper("attestation")
def attestation_file(w: dict[str, object]) -> None:
    home, ok = w["home"], w["ok"]
    assert isinstance(home, Path)
    path = home / "attestations" / f"{ok.id}.json"  # type: ignore[attr-defined]
    os.chmod(path, 0o644)
    path.write_text(path.read_text().replace('"unit"', '"unix"', 1))


@tamper("ahdb")
def ahdb_event(w: dict[str, object]) -> None:
    home = w["home"]
    assert isinstance(home, Path)
    conn = sqlite3.connect(home / "ahdb.sqlite")
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET payload = replace(payload, 'unit passes', 'all passes') "
                 "WHERE kind = 'propose'")
    conn.commit()


@tamper("ahdb_rule")
def forged_assert_with_recomputed_chain(w: dict[str, object]) -> None:
    """The strongest forgery: a well-formed ASSERT row with a valid chain link."""
    home, repo, db = w["home"], w["repo"], w["db"]
    assert isinstance(home, Path) and isinstance(repo, Path)
    payload = db._new(AtomKind.ASSERT, AtomStatus.PROMOTED,  # type: ignore[attr-defined]
                      claim="done", work_item="other", tree_hash=tree_hash(repo),
                      references=("f" * 32,), attestations=("a" * 64,))
    conn = sqlite3.connect(home / "ahdb.sqlite")
    seq, prev = conn.execute("SELECT seq, event_hash FROM events ORDER BY seq DESC").fetchone()
    created = "2026-01-01T00:00:00+00:00"
    from choir._core.canonical import canonical_json

    conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
                 (seq + 1, prev, event_hash(prev, seq + 1, "assert", payload, created),
                  "assert", canonical_json(payload).decode(), created))
    conn.commit()


@tamper("ahdb_state")
def forged_row_in_the_materialised_table(w: dict[str, object]) -> None:
    """The gate reads the tables: a forged ASSERT row there must not go unnoticed."""
    home, repo = w["home"], w["repo"]
    assert isinstance(home, Path) and isinstance(repo, Path)
    conn = sqlite3.connect(home / "ahdb.sqlite")
    claim_id, body = conn.execute("SELECT id, body FROM atoms WHERE kind = 'ASSERT' AND "
                                  "body NOT LIKE '%\"references\":[]%'").fetchone()
    conn.execute("INSERT INTO atoms VALUES (?, 99, 'ASSERT', 'PROMOTED', 'other', ?, ?)",
                 ("e" * 32, tree_hash(repo),
                  body.replace(claim_id, "e" * 32).replace('"wi"', '"other"')))
    conn.commit()
    assert open_ahdb().is_asserted("other") is not None  # the forgery reaches the gate


@tamper("ahdb_state")
def fail_forgotten_in_the_materialised_table(w: dict[str, object]) -> None:
    home = w["home"]
    assert isinstance(home, Path)
    conn = sqlite3.connect(home / "ahdb.sqlite")
    assert conn.execute("DELETE FROM fails").rowcount == 1
    conn.commit()


def _rewrite_log(home: Path, drop: Callable[[str], bool]) -> None:
    """Delete events and recompute every later seq and hash: a chain that links perfectly."""
    from choir._core.canonical import canonical_json

    conn = sqlite3.connect(home / "ahdb.sqlite")
    conn.execute("DROP TRIGGER events_no_delete")
    rows = conn.execute("SELECT kind, payload, created_at FROM events ORDER BY seq").fetchall()
    conn.execute("DELETE FROM events")
    prev, seq = "0" * 64, 0
    for kind, payload, created in rows:
        if drop(kind):
            continue
        seq += 1
        body = json.loads(payload)
        digest = event_hash(prev, seq, kind, body, created)
        conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
                     (seq, prev, digest, kind, canonical_json(body).decode(), created))
        prev = digest
    conn.execute("DELETE FROM fails")  # keep the tables true to the rewritten log
    conn.execute("DELETE FROM atoms WHERE kind = 'HYPOTHESIZE'")
    conn.commit()


@tamper("ahdb_head")
def middle_event_deleted_and_chain_recomputed(w: dict[str, object]) -> None:
    """Drop the HYPOTHESIZE (the lint FAIL's explanation), re-link everything after it."""
    home = w["home"]
    assert isinstance(home, Path)
    open_ahdb().propose(claim="later", work_item="wi2", tree_hash="1" * 64,
                        required_verifiers=["unit"])
    _rewrite_log(home, lambda kind: kind == "hypothesize")


@tamper("ahdb_truncated")
def tail_truncated(w: dict[str, object]) -> None:
    home = w["home"]
    assert isinstance(home, Path)
    _rewrite_log(home, lambda kind: kind == "hypothesize")  # it is the last event


@tamper("object_missing")
def deleted_report(w: dict[str, object]) -> None:
    home, ok = w["home"], w["ok"]
    assert isinstance(home, Path)
    digest = ok.body.report_hash  # type: ignore[attr-defined]
    (_artifacts(home) / "objects" / digest[:2] / digest[2:]).unlink()


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_audit_names_every_tampering(world: dict[str, object], name: str) -> None:
    fn, kind = TAMPERS[name]
    fn(world)
    code, out = audit()
    assert code == 1
    kinds = {v["kind"] for v in out["violations"]}
    assert any(k.startswith(kind) or kind in k for k in kinds), kinds
    for v in out["violations"]:
        assert v["object"] and v["expected"] and v["found"]


def test_audit_fails_closed_on_an_unreadable_attestation(world: dict[str, object]) -> None:
    home = world["home"]
    assert isinstance(home, Path)
    (home / "attestations" / ("b" * 64 + ".json")).write_text("{not json")
    code, out = audit()
    assert code == 1 and out["violations"]


def _forge_citation(world: dict[str, object], start: int, end: int, span: str | None) -> str:
    """A report signed by the trusted key whose one citation is chosen by the attacker."""
    from choir.attest import AttestationStore, load_signer, mint
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Citation, FailureSignature, VerificationReport

    ok = world["ok"]
    store = ArtifactStore()
    body = ok.body  # type: ignore[attr-defined]
    log = body.artifacts["logs/combined.log"]
    report = VerificationReport.model_validate_json(store.read_bytes(body.report_hash))
    cite = Citation(artifact=log, line_start=start, line_end=end,
                    span_hash=span if span is not None else store.span_hash(log, start, end))
    forged = report.model_copy(update={"failure_signatures": (
        FailureSignature(id="f" * 16, kind="assertion", excerpt="x", citation=cite),)})
    digest = store.ingest_bytes(forged.model_dump_json().encode())
    att = mint(body.model_copy(update={"report_hash": digest}), load_signer())
    AttestationStore().put(att)
    open_ahdb().record_outcome(att.id)  # the attacker holds the key: as anchored as can be
    return att.id


def test_audit_rederives_every_citation(world: dict[str, object]) -> None:
    """Issue #11 item 12: lines 9000-9999 of a one-line log with a zero hash, signed."""
    _forge_citation(world, 9000, 9999, "0" * 64)
    code, out = audit()
    assert code == 1
    kinds = {v["kind"] for v in out["violations"]}
    assert "citation_bounds" in kinds, kinds


def test_audit_catches_a_wrong_span_hash_in_bounds(world: dict[str, object]) -> None:
    _forge_citation(world, 1, 1, "0" * 64)
    code, out = audit()
    assert code == 1
    assert {v["kind"] for v in out["violations"]} == {"citation_hash"}, out["violations"]


def test_a_true_citation_passes_audit(world: dict[str, object]) -> None:
    _forge_citation(world, 1, 1, None)
    code, out = audit()
    assert code == 0, out["violations"]
