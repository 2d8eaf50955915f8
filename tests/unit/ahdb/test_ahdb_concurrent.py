"""Four processes promote the same claims while one of them records an attested FAIL.

The hazard is a lost update: a writer checks "no FAIL on this tree" and promotes, while
another records the FAIL and demotes what is PROMOTED; unserialised, the promotion lands
after the demotion scan and a claim stays PROMOTED against the evidence. With the store's
exclusive write transaction (SQLite ``BEGIN IMMEDIATE``, Postgres advisory lock) the log is
one order, and the state is the rules applied to it: no claim survives the FAIL, each
claim is promoted at most once, every reported success is an event, and audit is clean.
"""

from __future__ import annotations

import multiprocessing
import random
from pathlib import Path

from choir.ahdb import open_ahdb
from choir.evidence.tree import tree_hash
from choir.models import AtomKind, AtomStatus
from tests.evidence import attest, make_repo

CLAIMS, PROCS = 16, 4


def _racer(home: str, repo: str, claims: list[str], att: str, fail_after: int | None,
           seed: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import os

    os.environ["CHOIR_HOME"] = home
    os.environ["CHOIR_ARTIFACT_DIR"] = home + "/artifacts"
    import tests.evidence
    from choir.exceptions import PromotionError

    tests.evidence._counter = 1000 * (seed + 1)  # run ids of its own, not the parent's

    db = open_ahdb()
    order = list(claims)
    random.Random(seed).shuffle(order)
    promoted, fail_id = [], None
    for i, claim_id in enumerate(order):
        if i == fail_after:
            fail_id = attest(Path(repo), "unit", "false").id  # logs the outcome, demotes
        try:
            db.promote(claim_id, [att])
            promoted.append(claim_id)
        except PromotionError:
            pass
    out.put((promoted, fail_id))


def test_concurrent_promoters_and_a_fail_lose_no_update(tmp_path: Path,
                                                        choir_home: Path) -> None:
    from choir.audit import audit

    repo = make_repo(tmp_path / "repo")
    tree = tree_hash(repo)
    db = open_ahdb()
    claims = [db.propose(claim=f"c{i}", work_item="wi", tree_hash=tree,
                         required_verifiers=["unit"]).id for i in range(CLAIMS)]
    passes = [attest(repo, "unit", "true").id for _ in range(PROCS)]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(choir_home), str(repo), claims, passes[j],
                                              CLAIMS // 3 if j == 0 else None, j, out))
             for j in range(PROCS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    promoted = [c for r, _ in results for c in r]
    (fail_id,) = [f for _, f in results if f]

    db = open_ahdb()
    events = list(db.events())
    promote_events = [e.payload["atom_id"] for e in events if e.kind == "promote"]
    assert sorted(promote_events) == sorted(promoted)  # every success is an event, no more
    assert len(set(promote_events)) == len(promote_events)  # no claim promoted twice
    status = {a.id: a for a in db.atoms("wi", AtomKind.ASSERT)}
    # no claim outlives the attested FAIL on its tree, whoever won which race
    assert not [c for c in claims if status[c].status is AtomStatus.PROMOTED]
    for c in set(promoted):
        assert status[c].status is AtomStatus.DEMOTED and fail_id in status[c].attestations
    fail_seq = next(e.seq for e in events if e.kind == "outcome" and
                    e.payload["attestation"] == fail_id)
    assert all(e.seq < fail_seq for e in events if e.kind == "promote")
    result = audit()  # the tables equal the log replayed through the rules, chain intact
    assert result.ok, result.violations
