"""``choir ahdb list`` on a terminal: columns stay in line whatever the ids and claims."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from choir.ahdb import open_ahdb
from tests import forked


def test_long_work_item_ids_and_claims_keep_the_columns_in_line(choir_home: Path) -> None:
    db = open_ahdb()
    long_item = "team-backlog-" + "x" * 60
    for item, claim in (("short", "add must add"), (long_item, "the claim " * 40),
                        ("evil", "\x1b]0;title\x07claim with escapes")):
        db.propose(claim=claim, work_item=item, tree_hash="a" * 64, required_verifiers=["unit"])
    env = dict(os.environ, COLUMNS="120")
    out = forked.run([sys.executable, "-m", "choir", "ahdb", "list"], capture_output=True,
                     text=True, env=env, timeout=60, check=True).stdout
    lines = out.splitlines()
    assert all(len(line) <= 120 for line in lines), out
    header = lines[0]
    status_at = header.index("status")
    rows = [line for line in lines[1:] if "ASSERT" in line]
    assert len(rows) == 3 and all(line[status_at:].startswith("PROPOSED") for line in rows), out
    claim_at = header.index("claim")
    starts = sorted(line[claim_at:claim_at + 9] for line in rows)
    assert starts == ["add must ", "claim wit", "the claim"], out  # every claim in its column
    assert "\x1b" not in out and "\x07" not in out
    assert "…" in out  # the long claim is cut visibly, not silently
