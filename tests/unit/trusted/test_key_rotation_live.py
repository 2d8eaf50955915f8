"""Review 23a, F2: ``choir keys rotate`` beside a running, confined command (``choir mcp``, a
long ``choir run``). The signer it held kept signing with the old, maybe revoked, key (the
broker checked the key file only on ``hello``), and ``trusted.signer()`` then raised EROFS:
the broker answered ``stale`` and its replacement was forked from the confined process,
whose key folder is an empty read-only tmpfs. Now the broker refuses a signature asked
under the replaced key, loads the new key itself (it sees the key folder), and the command
goes on signing with the new key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from choir.attest import verify_signature
from choir.trusted.keyfile import load_key, rotate_key

CHILD = r'''
import json, sys
from pathlib import Path
from choir import trusted
home = Path(sys.argv[1])
out = {"level": trusted.separate(home)}
held = trusted.signer(home)
out["before"] = held.key_id
held.sign(b'{"n":1,"type":"choir.probe/v1"}')
print("ready", flush=True)
sys.stdin.readline()  # the person rotates the key now
try:
    held.sign(b'{"n":2,"type":"choir.probe/v1"}')  # a body built for the old key id
    out["held"] = "signed"
except Exception as exc:
    out["held"] = f"{type(exc).__name__}: {exc}"
try:
    fresh = trusted.signer(home)
    body = b'{"n":3,"type":"choir.probe/v1"}'
    out.update(after=fresh.key_id, public_key=fresh.public_key, signature=fresh.sign(body),
               held_after=held.key_id, same=fresh is held)
except Exception as exc:
    out["after"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out), flush=True)
'''


def test_a_running_confined_command_signs_with_the_new_key_never_the_old(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = load_key(home).key_id
    with subprocess.Popen([sys.executable, "-c", CHILD, str(home)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          cwd="/", env=dict(os.environ, CHOIR_HOME=str(home))) as child:
        assert child.stdout is not None and child.stdin is not None
        try:
            assert child.stdout.readline().strip() == "ready"
            _, fresh = rotate_key(home)  # what `choir keys rotate` does
            child.stdin.write("\n")
            child.stdin.flush()
            out = json.loads(child.stdout.readline())
        finally:
            child.kill()
    assert out["level"] != "process" or os.geteuid() != 0
    assert out["before"] == old
    assert out["held"].startswith("IntegrityError") and "rotated" in out["held"], out
    assert out["after"] == fresh.key_id, out  # not EROFS: the broker loaded the new key
    assert verify_signature(out["public_key"], b'{"n":3,"type":"choir.probe/v1"}',
                            out["signature"])
    assert out["held_after"] == fresh.key_id and out["same"] is True
    journal = [json.loads(line) for line in
               (home / "keys" / "signed.log").read_text().splitlines()]
    assert [e["key_id"] for e in journal] == [old, fresh.key_id]  # nothing more under old
