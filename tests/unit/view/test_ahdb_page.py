"""The AHDB page never shows green what the gate refuses (review 17c)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import forked
from tests.evidence import attest, make_repo


def test_an_assert_whose_claim_was_demoted_is_not_shown_live(
        tmp_path: Path, choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An honest writer: a work item ASSERTed, then an attested FAIL of the same verifier on
    the same tree demotes the claim behind it. ``choir gate`` refuses; the page drew the
    ASSERT's row status, PROMOTED, in the green of a PASS."""
    from starlette.testclient import TestClient

    from choir.ahdb import open_ahdb
    from choir.app.gate import check_gate
    from choir.attest import load_signer
    from choir.evidence.artifacts import ArtifactStore
    from choir.evidence.tree import tree_hash
    from choir.view.serve import build

    monkeypatch.setenv("CHOIR_TRUSTED_KEYS", load_signer().key_id)
    repo = make_repo(tmp_path / "repo")
    tree = tree_hash(repo)
    db = open_ahdb()
    passed = attest(repo, "unit", "true", work_item="wi")
    db.record_outcome(passed.id)
    claim = db.propose(claim="unit passes", work_item="wi", tree_hash=tree,
                       required_verifiers=["unit"])
    db.promote(claim.id, [passed.id])
    done = db.assert_work_item("wi", tree, references=[claim.id], claim="wi is done")
    app, _ = build(choir_home, ArtifactStore().root, token="t" * 32, port=8125)
    client = TestClient(app, base_url="http://127.0.0.1:8125")

    def status_of(atom_id: str) -> str:
        page = client.get("/ahdb?token=" + "t" * 32).text
        row = re.search(rf'<tr class="atom" id="atom-{atom_id}">.*?</tr>', page, re.S)
        assert row is not None, page[:2000]
        return re.findall(r'class="verdict v-([\w-]+)"', row.group(0))[0]

    assert check_gate("wi", tree=tree, commit=None).passed
    assert status_of(done.id) == "promoted"
    db.record_outcome(attest(repo, "unit", "false", work_item=None).id)  # a FAIL, same tree
    assert not check_gate("wi", tree=tree, commit=None).passed
    assert status_of(claim.id) == "demoted"
    assert status_of(done.id) == "not-live"
    import json
    import os
    import sys

    listed = forked.run([sys.executable, "-m", "choir", "ahdb", "list", "--json"],
                        capture_output=True, text=True, timeout=60, env=dict(os.environ))
    live = {a["id"]: a.get("live") for a in json.loads(listed.stdout)}
    assert (live[done.id], live[claim.id]) == (False, False)
    table = forked.run([sys.executable, "-m", "choir", "ahdb", "list"],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert "NOT LIVE" in next(line for line in table.stdout.splitlines()
                              if line.startswith(done.id[:12]))
