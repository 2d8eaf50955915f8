"""A tree-handling bug in the confined process finds no key: not by path, not through a
link, not through the broker's /proc entries, not in anyone's memory; signatures still verify.

The probe runs in its own process (confinement changes the process for good). The control
runs the same probe with the key loaded in-process, as every command did before the broker:
each read there succeeds, so the probe is live.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from choir.attest import verify_signature

PROBE = r'''
import json, os, subprocess, sys
from pathlib import Path

home, repo, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if mode == "separated":
    from choir.trusted import separate, signer
    level = separate(home)
    s = signer(home)
    pid = s.pid
else:  # the old code: the signing key loaded in the process that walks the tree
    from choir.trusted.keyfile import load_key
    s, level, pid = load_key(home), "none", os.getpid()
seed = bytes.fromhex(sys.argv[4])

def read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(1 << 16).decode("latin-1")
    except OSError as err:
        return f"ERR {err.strerror}"

def in_memory(target):
    """Whether the key's 32 secret bytes are anywhere in ``target``'s readable memory."""
    try:
        maps = open(f"/proc/{target}/maps").read().splitlines()
        mem = open(f"/proc/{target}/mem", "rb", buffering=0)
    except OSError as err:
        return f"ERR {err.strerror}"
    with mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r") or "[vvar]" in line or "[vsyscall]" in line:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                if seed in mem.read(end - start):
                    return "FOUND"
            except (OSError, OverflowError, ValueError):
                continue
    return "absent"

key = home / "keys" / "ed25519.key"
loot = {
    "key file": read(key),
    "link in the repo": read(repo / "lnk" / "ed25519.key"),
    "/proc/broker/root": read(f"/proc/{pid}/root{key}"),
    "/proc/broker/environ": read(f"/proc/{pid}/environ"),
    "/proc/broker/mem": in_memory(pid),
    "a child's cat": subprocess.run(["cat", str(key)], capture_output=True).stdout.decode(),
}
record = b'{"type":"choir.probe/v1"}'
print(json.dumps({"level": level, "loot": loot, "key_id": s.key_id,
                  "public_key": s.public_key, "signature": s.sign(record)}))
'''


def _seed(home: Path) -> bytes:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key((home / "keys" / "ed25519.key").read_bytes(), None)
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())  # type: ignore[union-attr]


def _probe(tmp_path: Path, mode: str, as_user: int | None = None
           ) -> tuple[dict[str, object], bytes, str]:
    home, repo = tmp_path / f"home-{mode}", tmp_path / f"repo-{mode}"
    repo.mkdir()
    from choir.trusted.keyfile import load_key

    key_id = load_key(home).key_id  # the key exists before the run, as in any used home
    (repo / "lnk").symlink_to(home / "keys")  # what the planted symlinked folder resolves to
    seed = _seed(home)
    prefix: list[str] = []
    if as_user is not None:
        for path in (tmp_path, home, repo, *home.rglob("*")):
            os.chown(path, as_user, as_user, follow_symlinks=False)
        prefix = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups"]
    proc = subprocess.run([*prefix, sys.executable, "-c", PROBE, str(home), str(repo), mode,
                           seed.hex()], capture_output=True, text=True, timeout=120, cwd="/",
                          env=dict(os.environ, HOME=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), seed, key_id


def _leaks(loot: dict[str, str], seed: bytes) -> dict[str, str]:
    pem = "BEGIN PRIVATE KEY"
    return {name: got[:60] for name, got in loot.items()
            if pem in got or got == "FOUND" or seed.hex() in got}


@pytest.mark.skipif(os.geteuid() != 0, reason="the mount-namespace level needs root")
def test_a_tree_bug_in_the_confined_process_gets_nothing_and_signatures_verify(
        tmp_path: Path) -> None:
    out, seed, key_id = _probe(tmp_path, "separated")
    assert out["level"] == "mount-namespace"
    assert _leaks(out["loot"], seed) == {}  # type: ignore[arg-type]
    loot = out["loot"]
    assert isinstance(loot, dict)
    assert loot["/proc/broker/mem"].startswith("ERR")  # refused, not merely searched
    assert loot["/proc/broker/root"].startswith("ERR")
    # environ stays readable on this kernel (a read-mode check): it holds the parent's own
    # variables at fork time, never the key, which the broker reads only after the fork
    assert out["key_id"] == key_id
    assert verify_signature(str(out["public_key"]), b'{"type":"choir.probe/v1"}',
                            str(out["signature"]))


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to become another user")
def test_a_user_that_is_not_root_gets_the_user_namespace_level(tmp_path: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="choir-broker-user-", dir="/tmp"))
    try:
        out, seed, key_id = _probe(work, "separated", as_user=65534)
    finally:
        shutil.rmtree(work)
    assert out["level"] == "user-namespace"
    assert _leaks(out["loot"], seed) == {}  # type: ignore[arg-type]
    loot = out["loot"]
    assert isinstance(loot, dict)
    assert loot["/proc/broker/mem"].startswith("ERR")
    assert out["key_id"] == key_id
    assert verify_signature(str(out["public_key"]), b'{"type":"choir.probe/v1"}',
                            str(out["signature"]))


def test_control_the_same_probe_steals_the_key_when_it_is_loaded_in_process(
        tmp_path: Path) -> None:
    out, seed, _ = _probe(tmp_path, "inprocess")
    leaked = _leaks(out["loot"], seed)  # type: ignore[arg-type]
    assert {"key file", "link in the repo", "/proc/broker/root", "/proc/broker/mem",
            "a child's cat"} <= set(leaked)
