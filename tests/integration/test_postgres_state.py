"""Two machines, one Postgres control state: what one runner promotes, the other can check.

"Machines" are two CHOIR_HOMEs (own keys, own attestation files) sharing one database and
one artifact directory, as two CI runners would share a Postgres server and a file share.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from choir.ahdb import open_ahdb
from choir.attest import AttestationStore, load_signer
from choir.evidence.tree import tree_hash
from choir.exceptions import IntegrityError
from tests.evidence import attest, make_repo


@pytest.fixture
def machines(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
             ) -> Iterator[tuple[Path, Path]]:
    a, b = tmp_path / "machine-a", tmp_path / "machine-b"
    monkeypatch.setenv("CHOIR_DATABASE_URL", pg_url)
    monkeypatch.setenv("CHOIR_TRUSTED_KEYS",
                       ",".join(load_signer(h).key_id for h in (a, b)))
    yield a, b


def _assert_on(home: Path, repo: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CHOIR_HOME", str(home))
    db = open_ahdb()
    claim = db.propose(claim="unit passes", work_item="wi", tree_hash=tree_hash(repo),
                       required_verifiers=["unit"])
    claim = db.promote(claim.id, [attest(repo, "unit", "true").id])
    return db.assert_work_item("wi", tree_hash(repo), references=[claim.id], claim="done").id


def test_what_machine_b_asserts_machine_a_gates_and_audits(
        machines: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from choir.app.gate import check_gate
    from choir.audit import audit

    a, b = machines
    repo = make_repo(tmp_path / "repo")
    assert_id = _assert_on(b, repo, monkeypatch)
    monkeypatch.setenv("CHOIR_HOME", str(a))
    assert not list((a / "attestations").glob("*.json"))  # nothing of B's on A's disk
    asserted = open_ahdb().is_asserted("wi", tree_hash(repo))
    assert asserted is not None and asserted.id == assert_id
    answer = check_gate("wi", tree=tree_hash(repo), commit=None)
    assert answer.passed, answer.problems
    result = audit(home=a)
    assert result.ok, result.violations
    assert result.counts["ahdb_events"] >= 4
    # a FAIL attested on A demotes the claim B promoted: one state, whoever writes
    attest(repo, "unit", "false")
    assert open_ahdb().is_asserted("wi", tree_hash(repo)) is None
    monkeypatch.setenv("CHOIR_HOME", str(b))
    assert open_ahdb().is_asserted("wi", tree_hash(repo)) is None


def test_a_forged_row_in_the_shared_index_is_refused(
        machines: tuple[Path, Path], tmp_path: Path, pg_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    a, b = machines
    repo = make_repo(tmp_path / "repo")
    monkeypatch.setenv("CHOIR_HOME", str(b))
    att = attest(repo, "unit", "true")
    forged = att.model_copy(update={"body": att.body.model_copy(update={"mood": "PANIC"})})
    with psycopg.connect(pg_url, autocommit=True) as pg:
        with pytest.raises(psycopg.Error, match="append-only"):
            pg.execute("UPDATE attestations SET body = %s", (forged.model_dump_json().encode(),))
        # the owner of the database drops the guard and swaps the bytes
        pg.execute("DROP TRIGGER attestations_no_change ON attestations")
        pg.execute("UPDATE attestations SET body = %s WHERE id = %s",
                   (forged.model_dump_json().encode(), att.id))
    monkeypatch.setenv("CHOIR_HOME", str(a))
    with pytest.raises(IntegrityError, match="does not hold"):
        AttestationStore().get(att.id)
    with pytest.raises(IntegrityError, match="other content"):
        AttestationStore(b / "attestations").shared.put(att.id, b"{}")  # type: ignore[union-attr]


def test_a_truncated_shared_log_is_named_by_every_machine_that_can_see_a_head(
        machines: tuple[Path, Path], tmp_path: Path, pg_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The database owner drops the guard and cuts the log's tail: the writer's own heads
    file names it; another machine names it from the shared heads; deleting those too hides
    it from that machine only, never from the writer."""
    import psycopg

    from choir.audit import audit

    a, b = machines
    repo = make_repo(tmp_path / "repo")
    _assert_on(b, repo, monkeypatch)
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute("DROP TRIGGER events_no_change ON events")
        pg.execute("DELETE FROM events WHERE seq = (SELECT max(seq) FROM events)")
    kinds_a = {v.kind for v in audit(home=a).violations}
    assert "ahdb_truncated" in kinds_a
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute("DROP TRIGGER heads_no_change ON heads")
        pg.execute("DELETE FROM heads")
    assert "ahdb_truncated" in {v.kind for v in audit(home=b).violations}
