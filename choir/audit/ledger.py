"""Auditing the AHDB's state: replay the log through the write rules, then hold every
materialised row and every live ASSERT against what the replay and the stored evidence say.

The store answers reads from tables it updates in the append's transaction; those tables are
derived data, so an edit to them alone (a DEMOTED claim set back to PROMOTED) is exactly what
this module exists to catch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from choir.ahdb.rules import Logged, Lookup, Replay, disputed, fails_of, replay
from choir.ahdb.signed import cached
from choir.models import Atom, AtomKind, AtomStatus, Attestation, Violation

if TYPE_CHECKING:
    from choir.ahdb.store import AHDB, Event


def _v(kind: str, obj: str, expected: str, found: str) -> Violation:
    return Violation(kind=kind, object=obj[:200], expected=expected[:300], found=found[:300])


def replay_log(events: Sequence[Event], lookup: Lookup, found: list[Violation],
               verified: dict[str, Attestation] | None = None) -> Replay:
    """The state the log implies, every event re-checked; refused events become violations."""
    state = Replay()

    def refused(ev: Logged, exc: Exception) -> None:
        found.append(_v("ahdb_rule", f"event {ev.seq} ({ev.kind})",
                        "an event the promotion rules allow", str(exc)))

    replay(events, state, cached(lookup, verified), refused)
    return state


def compare_tables(db: AHDB, replay: Replay) -> list[Violation]:
    """Every materialised row that the log does not imply, and every implied row missing."""
    found: list[Violation] = []
    conn = db._conn()
    try:
        rows = conn.execute("SELECT id, kind, status, work_item, tree_hash, body "
                            "FROM atoms").fetchall()
        fails = set(conn.execute("SELECT work_item, tree_hash, verifier FROM fails"))
        outcomes = {r[0] for r in conn.execute("SELECT attestation FROM outcomes")}
    except Exception as exc:  # fail closed: unreadable tables are a violation
        return [_v("ahdb_state_unreadable", str(db.path), "readable atoms/fails/outcomes",
                   str(exc))]
    seen: set[str] = set()
    for atom_id, kind, status, work_item, tree, body in rows:
        seen.add(atom_id)
        want = replay.atoms.get(atom_id)
        try:
            got: Atom | None = Atom.model_validate_json(body)
        except ValueError:
            got = None
        if want is None:
            found.append(_v("ahdb_state_extra", f"atom {atom_id}", "absent (not in the log)",
                            f"{kind} {status}"))
        elif got != want or (kind, status, work_item, tree) != (
                want.kind.value, want.status.value, want.work_item, want.tree_hash):
            found.append(_v("ahdb_state_atom", f"atom {atom_id}",
                            f"{want.kind.value} {want.status.value}", f"{kind} {status}"))
    for atom_id in sorted(set(replay.atoms) - seen):
        found.append(_v("ahdb_state_missing", f"atom {atom_id}", "a row", "absent"))
    for w, t, v in sorted(fails ^ replay.fails, key=str):
        where = "extra" if (w, t, v) in fails else "missing"
        found.append(_v("ahdb_state_fails", f"{w}/{t[:16]}/{v}", "as the log implies", where))
    for att_id in sorted(outcomes ^ replay.outcomes, key=str):
        where = "extra" if att_id in outcomes else "missing"
        found.append(_v("ahdb_state_outcomes", f"outcome {att_id}", "as the log implies",
                        where))
    return found


def contradicted(state: Replay, stored_fails: Sequence[Attestation]) -> list[Violation]:
    """Live claims that an attested FAIL on their tree disputes (``rules.disputed``).

    The FAILs are the log's and every valid stored one: a FAIL can be minted (by ``choir
    verify``, or a run that crashed before logging it) without reaching the AHDB; the claim
    it contradicts must then not pass for evidence either.
    """
    seen = Replay()
    seen.atoms, seen.fails = state.atoms, state.fails | fails_of(list(stored_fails))
    found: list[Violation] = []
    for atom in state.atoms.values():
        if atom.kind is not AtomKind.ASSERT or atom.status is not AtomStatus.PROMOTED or \
                atom.references:
            continue
        for verifier in disputed(seen, atom):
            found.append(_v("ahdb_contradicted", f"claim {atom.id}",
                            "demoted by the attested FAIL",
                            f"PROMOTED despite an attested FAIL of {verifier} on its tree"))
    return found
