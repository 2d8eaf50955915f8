"""The gate and promotion answer from the signed log, never from the tables or an unsigned tail.

Review 12's attacker can write ``CHOIR_HOME`` (or the Postgres database) but holds no key;
the key is pinned with ``CHOIR_TRUSTED_KEYS``, as CI does. Two attacks, both watched opening
the gate on the code before the fix:

- F2: one ``UPDATE atoms SET status='PROMOTED'`` turned a claim an attested FAIL had demoted
  back into an open gate (the gate read the materialised tables).
- F1: a ``propose``/``promote``/``assert`` appended with Choir's own ``AHDB(signer=None)``
  opened the gate, left audit clean, and the next honest write signed a head over them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from choir.ahdb import AHDB, open_ahdb
from choir.ahdb.anchor import SeenHeads
from choir.app.gate import check_gate
from choir.attest import AttestationStore, load_signer
from choir.audit.integrity import audit
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import tree_hash
from choir.exceptions import IntegrityError, PromotionError
from tests import forked
from tests.evidence import attest, make_repo


@pytest.fixture
def pinned(choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The home's key, pinned outside the home as CI pins it."""
    key = load_signer().key_id
    monkeypatch.setenv("CHOIR_TRUSTED_KEYS", key)
    return key


def _gate(work_item: str, tree: str, seen: Path | None = None) -> tuple[bool, list[str]]:
    answer = check_gate(work_item, tree=tree, commit=None,
                        seen=SeenHeads(seen) if seen else None)
    return answer.passed, answer.problems


def _asserted(db: AHDB, repo: Path, work_item: str, verifier: str) -> None:
    """An honest ASSERT of ``work_item`` on ``repo``'s tree: a PASS of ``verifier``."""
    tree = tree_hash(repo)
    ok = attest(repo, verifier, "true", work_item=work_item)
    db.record_outcome(ok.id)
    claim = db.propose(claim=f"{verifier} passes", work_item=work_item, tree_hash=tree,
                       required_verifiers=[verifier])
    db.promote(claim.id, [ok.id])
    db.assert_work_item(work_item, tree, references=[claim.id], claim="done")


def _kinds(found: object) -> list[str]:
    return sorted(v.kind for v in getattr(found, "violations", ()))


def test_a_table_edit_does_not_reopen_a_gate_a_fail_closed(tmp_path: Path, pinned: str
                                                           ) -> None:
    """F2: the demoted claim set back to PROMOTED in ``atoms``, nothing else touched."""
    repo = make_repo(tmp_path / "repo")
    tree = tree_hash(repo)
    db = open_ahdb()
    _asserted(db, repo, "wi", "unit")
    assert _gate("wi", tree)[0]
    db.record_outcome(attest(repo, "unit", "false", work_item=None).id)  # demotes
    assert not _gate("wi", tree)[0]

    conn = db._conn()
    for atom_id, body in conn.execute(
            "SELECT id, body FROM atoms WHERE status = 'DEMOTED'").fetchall():
        data = json.loads(body)
        data["status"] = "PROMOTED"
        conn.execute("UPDATE atoms SET status = 'PROMOTED', body = ? WHERE id = ?",
                     (json.dumps(data), atom_id))
    assert db.is_asserted("wi", tree) is not None  # the tables now say it holds

    passed, problems = _gate("wi", tree)
    assert not passed, "the gate answered from the edited tables"
    assert any("not ASSERTed" in p for p in problems), problems
    assert "ahdb_state_atom" in _kinds(audit())


def _forge(repo: Path) -> tuple[str, int]:
    """The attacker: Choir's own store with no key appends propose/promote/assert for a new
    work item requiring only the verifier that passed. Returns (tree, the log's new head)."""
    atts = AttestationStore()
    lint = next(a for a in atts if a.body.verifier == "lint")
    tree = lint.body.target.tree_hash
    forger = AHDB(attestations=atts, artifacts=ArtifactStore(), signer=None,
                  trusted_keys={lint.signer_key_id})
    claim = forger.propose(claim="ship it", work_item="ship", tree_hash=tree,
                           required_verifiers=["lint"])
    forger.promote(claim.id, [lint.id])
    forger.assert_work_item("ship", tree, references=[claim.id], claim="ship is done")
    return tree, forger.head()[0]


def _verified(repo: Path) -> AHDB:
    """A ``choir verify`` of ``repo``: lint PASSes, unit FAILs, both outcomes logged."""
    db = open_ahdb()
    db.record_outcome(attest(repo, "lint", "true", work_item=None).id)
    db.record_outcome(attest(repo, "unit", "false", work_item=None).id)
    return db


def test_unsigned_events_open_no_gate_and_audit_names_each(tmp_path: Path, pinned: str
                                                          ) -> None:
    """F1: the forged ASSERT past the last signed head."""
    repo = make_repo(tmp_path / "repo")
    db = _verified(repo)
    assert not audit().violations
    signed = db.head()[0]
    seen = tmp_path / "seen"
    assert not _gate("ship", tree_hash(repo), seen)[0]
    tree, head = _forge(repo)
    assert head == signed + 3

    passed, problems = _gate("ship", tree, seen)
    assert not passed, "an ASSERT no trusted signed head covers opened the gate"
    assert any("signed head" in p for p in problems), problems
    mark = json.loads(seen.read_text())
    assert all(entry["seq"] <= signed for entry in mark.values()), mark

    found = audit()
    tail = [v for v in found.violations if v.kind == "ahdb_unsigned_tail"]
    assert [v.object for v in tail] == [f"event {s}" for s in range(signed + 1, head + 1)]
    assert "propose" in tail[0].found and "assert" in tail[-1].found


def test_an_honest_writer_never_signs_over_unsigned_events(tmp_path: Path, pinned: str
                                                          ) -> None:
    """No laundering: the next honest write refuses, rather than sign a head over the forged
    events; nothing is appended, and audit still names them."""
    repo = make_repo(tmp_path / "repo")
    _verified(repo)
    _, head = _forge(repo)
    other = make_repo(tmp_path / "other", "y = 2\n")
    db = open_ahdb()
    with pytest.raises(IntegrityError, match="not covered by a trusted signed head"):
        attest(other, "lint", "true", work_item=None)  # minting logs its outcome
    assert db.head()[0] == head
    assert "ahdb_unsigned_tail" in _kinds(audit())
    assert not _gate("ship", tree_hash(repo))[0]
    # and `choir verify` says so, exit 1, no traceback
    from tests.workitems import calc_repo

    calc = calc_repo(tmp_path / "calc", canary="c", sandbox="local")
    proc = forked.run([sys.executable, "-m", "choir", "verify", "--repo", str(calc)],
                      capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "choir: refused: " in proc.stderr and "not covered by a trusted signed head" in \
        proc.stderr
    assert db.head()[0] == head


_KILLED_WRITER = """
import sys
from choir.ahdb import open_ahdb
open_ahdb().record_outcome(sys.argv[1])
"""


def test_a_writer_killed_after_its_commit_leaves_a_signed_event(tmp_path: Path, pinned: str
                                                               ) -> None:
    """The crash window: the head is signed inside the event's transaction, so a kill -9
    right after the COMMIT (before the copy in the heads file) leaves nothing unsigned; the
    next honest write and the gate carry on, audit is clean."""
    repo = make_repo(tmp_path / "repo")
    db = _asserted_db = open_ahdb()
    _asserted(_asserted_db, repo, "wi", "unit")
    before = db.head()[0]
    other = make_repo(tmp_path / "other", "y = 2\n")
    fail = attest(other, "unit", "false", work_item=None)
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, fail.id],
                          env={**os.environ, "CHOIR_FAILPOINT": "ahdb:committed"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert db.head()[0] == before + 1  # committed, then killed
    assert not audit().violations
    assert _gate("wi", tree_hash(repo))[0]
    db.record_outcome(attest(other, "lint", "true", work_item=None).id)  # carries on
    assert not audit().violations


def test_a_log_rewritten_behind_the_processs_replay_is_replayed_again(
        tmp_path: Path, pinned: str, ahdb_backend: str) -> None:
    """A process that gated once replays only what was signed since (the plan driver gates
    every landing). Someone rewriting the log under it (every hash recomputed, so the chain
    is whole) changes the hash at the head it replayed to: it starts over, finds no trusted
    head that the rewritten log honours, and refuses."""
    if ahdb_backend == "postgres":
        pytest.skip("the rewrite drops SQLite's triggers; the memo's check is the same")
    from choir._core.canonical import canonical_json
    from choir.ahdb import event_hash

    repo = make_repo(tmp_path / "repo")
    db = open_ahdb()
    _asserted(db, repo, "wi", "unit")
    assert _gate("wi", tree_hash(repo))[0]  # replayed and kept by this process
    conn = db._conn()
    conn.execute("DROP TRIGGER events_no_update")
    prev = "0" * 64
    for seq, kind, payload, created in conn.execute(
            "SELECT seq, kind, payload, created_at FROM events ORDER BY seq").fetchall():
        body = json.loads(payload)
        if seq == 1:
            body["rewritten"] = True
        ehash = event_hash(prev, seq, kind, body, created)
        conn.execute("UPDATE events SET prev_hash = ?, event_hash = ?, payload = ? "
                     "WHERE seq = ?", (prev, ehash, canonical_json(body).decode(), seq))
        prev = ehash
    passed, problems = _gate("wi", tree_hash(repo))
    assert not passed and any("not covered by a trusted signed head" in p for p in problems)


def test_an_unsigned_event_a_person_vouches_for_is_adopted(tmp_path: Path, pinned: str
                                                          ) -> None:
    """The recovery for a log an older Choir left with its last event unsigned (killed
    between the commit and the head, before heads were stored with their events): writers
    refuse it until ``choir ahdb adopt SEQ`` lists the events and signs a head over them."""
    repo = make_repo(tmp_path / "repo")
    db = open_ahdb()
    _asserted(db, repo, "wi", "unit")
    AHDB(attestations=AttestationStore(), artifacts=ArtifactStore(), signer=None).propose(
        claim="unit passes", work_item="wi2", tree_hash=tree_hash(repo),
        required_verifiers=["unit"])  # what the old crash window left: written, never signed
    tail = db.head()[0]
    other = make_repo(tmp_path / "other", "y = 2\n")
    with pytest.raises(IntegrityError):  # minted and stored, its outcome refused
        attest(other, "unit", "true", work_item=None)
    stored = next(a for a in AttestationStore() if a.body.target.tree_hash == tree_hash(other))
    assert {"ahdb_unsigned_tail", "ahdb_outcome_missing"} <= set(_kinds(audit()))
    wrong = forked.run([sys.executable, "-m", "choir", "ahdb", "adopt", str(tail - 1),
                        "--yes"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1 and f"ends at seq {tail}" in wrong.stderr, wrong.stderr
    proc = forked.run([sys.executable, "-m", "choir", "ahdb", "adopt", str(tail), "--yes"],
                      capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"seq {tail}  propose" in proc.stdout
    db.record_outcome(stored.id)  # writers carry on
    assert db.head()[0] == tail + 1
    assert not audit().violations


def test_a_verification_is_remembered_only_inside_its_transaction(tmp_path: Path,
                                                                 pinned: str) -> None:
    """The AHDB checks an attestation once per write transaction (``AHDB._lookup``): what
    it remembers is the object it verified, never the file. An attestation rewritten on disk
    (a FAIL made a PASS) is not what the transaction reads after the swap, and the next
    transaction checks the file again and refuses it."""
    repo = make_repo(tmp_path / "repo")
    att = attest(repo, "unit", "false", work_item=None)
    assert att.body.result.value == "FAIL"
    db = open_ahdb()
    path = AttestationStore().path_of(att.id)
    honest = path.read_bytes()
    forged = honest.replace(b'"FAIL"', b'"PASS"')
    assert forged != honest
    with db._tx():
        assert db._lookup(att.id).body.result.value == "FAIL"
        os.chmod(path, 0o644)
        path.write_bytes(forged)
        assert db._lookup(att.id).body.result.value == "FAIL"  # the one it verified
    with db._tx(), pytest.raises((PromotionError, IntegrityError)):
        db._lookup(att.id)
    with pytest.raises((PromotionError, IntegrityError)):
        db._lookup(att.id)  # outside a transaction: checked every time


@pytest.fixture(scope="module")
def module_marks() -> Path | None:
    """Where a module-scoped fixture's ``choir`` run keeps its seen heads."""
    return SeenHeads.default_path()


def test_no_fixture_of_the_suite_writes_the_users_seen_heads(module_marks: Path | None) -> None:
    """A module-scoped fixture runs before the per-test home: its store's mark went to
    ~/.config/choir/seen-heads, which outlives the run, and a later CI run whose numbered temp
    dir reused the path was refused as a rewritten log."""
    user = Path.home() / ".config"
    assert module_marks is not None
    assert not module_marks.is_relative_to(user), module_marks
    assert not SeenHeads.default_path().is_relative_to(user)  # type: ignore[union-attr]
