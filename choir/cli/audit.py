"""``choir audit``, ``choir attest show`` and ``choir ahdb list``: thin wrappers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from choir.cli._errors import EXIT_FAIL, EXIT_OK


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option("--expect-head", "expect_head", type=click.Path(path_type=Path), default=None,
              metavar="FILE", help="Fail (ahdb_rollback) unless the AHDB log contains this "
              "exported signed head: a rollback behind it is caught.")
@click.option("--export-head", "export_head", type=click.Path(path_type=Path), default=None,
              metavar="FILE", help="After a clean audit, write the latest signed head to FILE "
              "(keep it outside CHOIR_HOME; pass it to --expect-head next time).")
def audit(as_json: bool, expect_head: Path | None, export_head: Path | None) -> int:
    """Re-derive every hash, signature and AHDB event: exit 0 clean, 1 violations."""
    from choir.ahdb.anchor import load_pin
    from choir.attest import key_summary
    from choir.audit import audit as run_audit

    pin = load_pin(expect_head) if expect_head else None
    result = run_audit(expect_head=pin)
    try:
        keys = key_summary()  # which keys signed, and which the pin trusts
    except Exception as exc:  # the audit has named what is broken; say it here too
        keys = {"signers": {}, "trusted": [], "source": f"unreadable ({type(exc).__name__})"}
    exported, why = None, "the audit is not clean"
    if export_head and result.ok:
        from choir.exceptions import IntegrityError

        try:
            exported = _export_head(export_head)
        except IntegrityError as exc:
            why = str(exc)
    if as_json:
        extra = {"keys": keys, **({"exported_head": exported} if exported else {})}
        click.echo(json.dumps({**json.loads(result.model_dump_json()), **extra}, indent=2))
    else:
        for v in result.violations:
            click.echo(f"VIOLATION {v.kind}: {v.object}: expected {v.expected}, found {v.found}")
        checked = ", ".join(f"{n} {k}" for k, n in sorted(result.counts.items()))
        verdict = "clean" if result.ok else f"{len(result.violations)} violation(s)"
        click.echo(f"audit: {verdict} ({checked})")
        if result.dangling:  # not evidence: listed so a crash's leftovers are seen
            shown = ", ".join(result.dangling[:10]) + (" ..." if len(result.dangling) > 10
                                                       else "")
            click.echo(f"audit: {len(result.dangling)} dangling run folder(s), named by no "
                       f"attestation (still running, or killed before attested; not "
                       f"evidence): {shown}")
        signed = ", ".join(f"{k} ({n})" for k, n in sorted(keys["signers"].items())) or "none"
        click.echo(f"audit: signed by key {signed}")
        click.echo(f"audit: trusted keys ({keys['source']}): {', '.join(keys['trusted'])}")
        if pin is not None:
            click.echo(f"audit: expected head seq {pin.seq} ({expect_head})")
        if exported:
            click.echo(f"audit: exported head seq {exported['seq']} to {export_head}")
        elif export_head:
            click.echo(f"audit: head not exported to {export_head}: {why}")
    return EXIT_OK if result.ok and (exported or not export_head) else EXIT_FAIL


def _export_head(path: Path | None) -> dict[str, object] | None:
    """Write the store's latest signed head to ``path``; returns what was written."""
    from choir.ahdb import open_ahdb
    from choir.ahdb.anchor import latest_head, write_pin
    from choir.attest import trusted_key_ids

    pin = latest_head(open_ahdb(), trusted_key_ids())
    if path is None:
        click.echo(pin.model_dump_json())
    else:
        write_pin(pin, path)
    return pin.model_dump(mode="json")


@click.group()
def attest() -> None:
    """Attestations: signed, content-addressed evidence."""


@attest.command("show")
@click.argument("attestation_id")
@click.option("--in-toto", "in_toto", is_flag=True,
              help="Print a DSSE envelope around an in-toto Statement v1.")
def attest_show(attestation_id: str, in_toto: bool) -> int:
    """Show one attestation (a unique id prefix is enough). With --in-toto, exit 1 and sign
    nothing when it does not re-verify or its key is not trusted."""
    from choir.attest import AttestationStore, load_signer, to_dsse
    from choir.exceptions import IntegrityError

    store = AttestationStore()
    att = store.get(store.find(attestation_id))
    if in_toto:
        try:
            envelope = to_dsse(att, load_signer())
        except IntegrityError as exc:
            click.echo(f"choir: {exc}", err=True)
            return EXIT_FAIL
        click.echo(json.dumps(envelope, indent=2, sort_keys=True))
    else:
        click.echo(att.model_dump_json(indent=2))
    return EXIT_OK


@attest.command("bundle")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--session", default=None, metavar="RUN_ID",
              help="Every attestation of this `choir verify` session (its run_id).")
@click.option("--out", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Write the bundle to FILE (replaced whole) instead of printing it.")
def attest_bundle(ids: tuple[str, ...], session: str | None, out: Path | None) -> int:
    """The in-toto bundle of attestations: JSON Lines of DSSE envelopes, each attestation as
    Choir's statement and as an in-toto test result. Exit 1, bundling nothing, when one does
    not re-verify or was not signed by a trusted key."""
    from choir.app.bundle import bundle_envelopes
    from choir.attest.standard import jsonl
    from choir.exceptions import IntegrityError

    try:
        text = jsonl(bundle_envelopes(ids, session))
    except IntegrityError as exc:
        click.echo(f"choir: {exc}", err=True)
        return EXIT_FAIL
    if out is None:
        click.echo(text, nl=False)
    else:
        from choir.cli._render import write_whole

        write_whole(out, text)
        click.echo(f"attest bundle: {text.count(chr(10))} envelope(s) written to {out}")
    return EXIT_OK


@click.group()
def ahdb() -> None:
    """The AHDB control state: ASSERT, HYPOTHESIZE and HYPERTHESIS atoms."""


@ahdb.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array on stdout.")
@click.option("--work-item", default=None, help="Only atoms of this work item.")
def ahdb_list(as_json: bool, work_item: str | None) -> int:
    """List atoms with their status and attestation ids."""
    from choir.ahdb import open_ahdb
    from choir.ahdb.rules import dead_asserts

    atoms = open_ahdb().atoms(work_item=work_item)
    dead = dead_asserts(atoms)
    if as_json:  # "live": false on an ASSERT the gate refuses (a claim behind it demoted)
        click.echo(json.dumps([{**a.model_dump(mode="json"),
                                **({"live": a.status.value == "PROMOTED" and a.id not in dead}
                                   if a.kind.value == "ASSERT" else {})} for a in atoms],
                               indent=2))
        return EXIT_OK
    if atoms:
        _atom_table(atoms, dead)
    if not atoms:
        click.echo("no atoms")
    return EXIT_OK


def _atom_table(atoms: list[Any], dead: set[str]) -> None:
    """Atoms in columns that stay in line on any terminal: a long work item id wraps inside
    its column, attestations beyond two are counted, and the claim, last, ends in an ellipsis
    at the terminal's edge (a 70-character id pushed every later column out of line)."""
    import shutil
    import textwrap

    from choir._core.terminal import shorten, strip_controls

    width = shutil.get_terminal_size(fallback=(120, 24)).columns
    item_w = 24
    fixed = f"{'id':<12}  {'kind':<11} {'status':<9} {'work item':<{item_w}} {'attestations':<29} "
    claim_w = max(10, width - len(fixed))
    click.echo(fixed + "claim")
    for atom in atoms:
        atts = [a[:12] for a in atom.attestations]
        shown = ",".join(atts[:2]) + (f"+{len(atts) - 2}" if len(atts) > 2 else "") or "-"
        item = textwrap.wrap(strip_controls(atom.work_item or "-"), item_w,
                             break_long_words=True) or ["-"]
        claim = shorten(" ".join(strip_controls(atom.claim).split()), claim_w)
        status = "NOT LIVE" if atom.id in dead else atom.status.value  # the gate refuses it
        click.echo(f"{atom.id[:12]:<12}  {atom.kind.value:<11} {status:<9} "
                   f"{item[0]:<{item_w}} {shown:<29} {claim}")
        for more in item[1:]:
            click.echo(f"{'':<12}  {'':<11} {'':<9} {more}")


@ahdb.command("head")
@click.option("--out", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Write it to FILE (replaced whole) instead of printing it.")
def ahdb_head(out: Path | None) -> int:
    """Export the latest signed head of the AHDB log, to pin outside CHOIR_HOME.

    `choir audit --expect-head FILE` and `choir gate --expect-head FILE` then refuse a log
    that does not contain it (a rollback). Exit 1 when no signed head matches the log.
    """
    from choir.exceptions import IntegrityError

    try:
        _export_head(out)
    except IntegrityError as exc:
        click.echo(f"choir: {exc}", err=True)
        return EXIT_FAIL
    return EXIT_OK


@ahdb.command("adopt")
@click.argument("through", type=int)
@click.option("--yes", is_flag=True, help="Sign without asking (the events are listed anyway).")
def ahdb_adopt(through: int, yes: bool) -> int:
    """Sign a head over events no trusted signed head covers, up to THROUGH (the log's end).

    Only for events you know this Choir wrote: a log from a version that signed heads after
    the commit, killed in between. An honest Choir writes no other; anything else was written
    without the key: restore the store from a backup instead. Lists the events first.
    """
    from choir.ahdb import open_ahdb
    from choir.attest import trusted_key_ids
    from choir.exceptions import IntegrityError

    db = open_ahdb()
    covered, _ = db.signed_head(trusted_key_ids())
    events = [ev for ev in db.events(since=covered + 1)]
    if not events:
        click.echo(f"every event is covered by a trusted signed head (the log ends at seq "
                   f"{covered})")
        return EXIT_OK
    for ev in events:
        click.echo(f"  seq {ev.seq}  {ev.kind:<12} {ev.created_at}  "
                   f"{json.dumps(ev.payload, sort_keys=True)[:160]}")
    if not yes and not click.confirm(f"sign a head over these {len(events)} event(s)?"):
        return EXIT_FAIL
    try:
        db.adopt(through)
    except IntegrityError as exc:
        click.echo(f"choir: {exc}", err=True)
        return EXIT_FAIL
    click.echo(f"signed a head at seq {through}")
    return EXIT_OK
