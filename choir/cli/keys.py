"""``choir keys``: show the signing key, rotate it, revoke a key id.

Rotation makes a new key and pins it beside the old one, so attestations signed before stay
valid; ``--revoke`` (or ``choir keys revoke ID``) records an id in
``$CHOIR_HOME/revoked_keys``, after which ``choir gate`` and ``choir audit`` refuse
everything it signed, by name (``attestation_key_revoked``, ``ahdb_head_key_revoked``).
"""

from __future__ import annotations

import os
from pathlib import Path

import click


def _append_line(path: Path, line: str, header: str) -> None:
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            os.write(fd, header.encode("ascii"))
        elif os.pread(fd, 1, size - 1) != b"\n":  # a hand-edited list without a final newline
            os.write(fd, b"\n")
        os.write(fd, f"{line}\n".encode("ascii"))
    finally:
        os.close(fd)


def _revoke(home: Path, key_id: str) -> None:
    from choir.trusted.keylists import REVOKE_FILE, _parse_ids

    _parse_ids(key_id, path="KEY_ID", lines=False)  # the same format check as the lists
    _append_line(home / REVOKE_FILE, key_id,
                 "# Choir revoked key ids, one per line: nothing they signed counts\n")


@click.group()
def keys() -> None:
    """Show, rotate or revoke this home's signing key."""


@keys.command("show")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object, with the public key (base64 of the raw ed25519 key) that "
              "checks the signatures of `choir attest bundle` and `choir gate --vsa`.")
def keys_show(as_json: bool) -> int:
    """Print the signing key id, the pinned ids and the revoked ids."""
    from choir.attest import load_signer, trust_root

    signer, root = load_signer(), trust_root()
    if as_json:
        import json

        click.echo(json.dumps({"key_id": signer.key_id, "public_key": signer.public_key,
                               "keytype": "ed25519", "trusted": sorted(root.keys),
                               "revoked": sorted(root.revoked), "source": root.source},
                              indent=2))
        return 0
    click.echo(f"signing key: {signer.key_id}")
    click.echo(root.describe())
    return 0


@keys.command("rotate")
@click.option("--revoke", "revoke_old", is_flag=True,
              help="Also revoke the old key: nothing it signed counts any more.")
def keys_rotate(revoke_old: bool) -> int:
    """Make a new signing key; keep the old public key and trust unless --revoke."""
    from choir._core.paths import choir_home
    from choir.attest.keys import PIN_FILE, TRUST_ENV, trust_root
    from choir.trusted import close_all
    from choir.trusted.keyfile import rotate_key

    home = choir_home()
    trust_root(home)  # pins the current key on first use, so it stays trusted after rotation
    close_all()
    old, new = rotate_key(home)
    if os.environ.get(TRUST_ENV, "").strip():
        click.echo(f"{TRUST_ENV} pins the trusted keys: add {new.key_id} to it")
    else:
        _append_line(home / PIN_FILE, new.key_id, "")
    click.echo(f"new signing key: {new.key_id}")
    if old is not None:
        click.echo(f"old key {old}: public key kept in keys/retired/{old}.pub")
        if revoke_old:
            _revoke(home, old)
            click.echo(f"revoked {old}: `choir gate` and `choir audit` refuse what it signed")
    return 0


@keys.command("revoke")
@click.argument("key_id")
def keys_revoke(key_id: str) -> int:
    """Revoke KEY_ID: gate and audit refuse every attestation and head it signed."""
    from choir._core.paths import choir_home

    _revoke(choir_home(), key_id.strip())
    click.echo(f"revoked {key_id.strip()}")
    return 0
