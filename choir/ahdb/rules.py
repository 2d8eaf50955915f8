"""The promotion rules (docs/concepts.md), as one function over (state, event).

Every write to the AHDB passes through ``check`` before it is appended, and ``choir audit``
replays the whole log through the same function, so a row inserted behind the store's back
is caught exactly as a forbidden write would have been refused.

- ASSERT claims are PROPOSED with the verifiers they need (never none: no verifier, no assert).
- promote: every attestation valid and trusted, PASS, for the same tree (and commit), covering
  every required verifier, none of which has an attested FAIL for that work item on that tree
  (a HYPOTHESIZE on record): a tree does not change, so that would be disagreement.
- a work-item ASSERT references only PROMOTED claims of the same work item and tree.
- demote: a valid FAIL attestation for the same tree, of a verifier the claim requires.
- HYPOTHESIZE: valid FAIL attestations for that tree and a discriminating test.
- HYPERTHESIS: a disclosure; it can never be promoted or referenced.
- outcome: a valid attestation's result, written when it is minted; it changes no atom, so
  audit can require that every stored attestation appears in the log (anchoring).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from choir.exceptions import PromotionError
from choir.models import Atom, AtomKind, AtomStatus, Attestation, Result

# attestation id -> the attestation, or raises PromotionError when missing/invalid/untrusted
Lookup = Callable[[str], Attestation]


class State(Protocol):
    """What the rules read: atoms by id and the attested FAILs on record per tree.

    The store answers from its materialised tables (indexed: a write costs the same at 1,000
    or 100,000 events); audit answers from a replay of the log (``Replay``).
    """

    def get(self, atom_id: str) -> Atom | None: ...

    def failed(self, work_item: str, tree_hash: str) -> set[str]: ...

    def has_outcome(self, attestation_id: str) -> bool: ...


@dataclass(frozen=True)
class Change:
    """What one allowed event does: the atom it writes and the verifiers it records as FAILed."""

    atom: Atom | None
    failed: frozenset[str] = frozenset()
    outcome: str | None = None
    # (work item, tree) of an outcome's FAIL: on record even when no claim was live to demote
    fail_target: tuple[str, str] | None = None


class Replay:
    """``State`` held in memory, built by applying events in order (audit, tests)."""

    def __init__(self) -> None:
        self.atoms: dict[str, Atom] = {}
        self.fails: set[tuple[str, str, str]] = set()
        self.outcomes: set[str] = set()

    def get(self, atom_id: str) -> Atom | None:
        return self.atoms.get(atom_id)

    def failed(self, work_item: str, tree_hash: str) -> set[str]:
        return {v for w, t, v in self.fails if w == work_item and t == tree_hash}

    def has_outcome(self, attestation_id: str) -> bool:
        return attestation_id in self.outcomes

    def record(self, change: Change) -> None:
        if change.outcome:
            self.outcomes.add(change.outcome)
        if change.fail_target:
            self.fails |= {(*change.fail_target, v) for v in change.failed}
        atom = change.atom
        if atom is None:
            return
        self.atoms[atom.id] = atom
        if atom.work_item and atom.tree_hash:
            self.fails |= {(atom.work_item, atom.tree_hash, v) for v in change.failed}


def _atts(lookup: Lookup, ids: tuple[str, ...] | list[str], atom: Atom,
          want: Result | None) -> list[Attestation]:
    found = []
    for att_id in ids:
        att = lookup(att_id)
        if want is not None and att.body.result is not want:
            raise PromotionError(f"attestation {att_id[:16]} is {att.body.result.value}, "
                                 f"not {want.value}")
        target = att.body.target
        if target.tree_hash != atom.tree_hash:
            raise PromotionError(f"attestation {att_id[:16]} is for another tree")
        if atom.commit_sha and target.commit_sha and target.commit_sha != atom.commit_sha:
            raise PromotionError(f"attestation {att_id[:16]} is for another commit")
        found.append(att)
    return found


def apply(atoms: State, kind: str, payload: dict[str, Any], at: datetime,
          lookup: Lookup) -> Change:
    """Check ``payload`` against the rules and return the change it makes.

    Raises:
        PromotionError: the event is forbidden.
    """
    if kind in ("propose", "assert", "hypothesize", "hyperthesis"):
        atom = Atom.model_validate(payload["atom"])
        if atoms.get(atom.id) is not None:
            raise PromotionError(f"atom {atom.id} already exists")
        if kind == "propose":
            if atom.kind is not AtomKind.ASSERT or atom.status is not AtomStatus.PROPOSED:
                raise PromotionError("only PROPOSED ASSERT claims are proposed")
            if not atom.required_verifiers:
                raise PromotionError("no verifier, no assert: a claim needs required verifiers")
            if atom.attestations or atom.references:
                raise PromotionError("a proposed claim carries no evidence yet")
        elif kind == "assert":
            _check_assert(atoms, atom)
        elif kind == "hypothesize":
            if atom.kind is not AtomKind.HYPOTHESIZE or not atom.discriminating_test:
                raise PromotionError("HYPOTHESIZE needs a discriminating test")
            if not atom.attestations:
                raise PromotionError("HYPOTHESIZE needs the FAIL attestation it explains")
            fails = _atts(lookup, atom.attestations, atom, Result.FAIL)
            return Change(atom, frozenset(a.body.verifier for a in fails))
        else:
            if atom.kind is not AtomKind.HYPERTHESIS or atom.status is not AtomStatus.PROPOSED:
                raise PromotionError("HYPERTHESIS is a PROPOSED disclosure, nothing more")
            _atts(lookup, atom.attestations, atom, None)
        return Change(atom)
    if kind == "outcome":
        att_id = str(payload.get("attestation", ""))
        if atoms.has_outcome(att_id):
            raise PromotionError(f"the outcome of {att_id[:16]} is already recorded")
        att = lookup(att_id)
        target = att.body.target
        if att.body.result is Result.FAIL and target.work_item:
            # a FAIL blocks promotion on its tree whether or not a claim was live to demote
            return Change(None, frozenset({att.body.verifier}), att.id,
                          (target.work_item, target.tree_hash))
        return Change(None, outcome=att.id)
    atom_id = payload.get("atom_id", "")
    found = atoms.get(atom_id)
    if found is None:
        raise PromotionError(f"no atom {atom_id}")
    atom = found
    if kind == "promote":
        if atom.kind is not AtomKind.ASSERT or atom.status is not AtomStatus.PROPOSED or \
                atom.references:
            raise PromotionError(f"atom {atom_id[:16]} cannot be promoted ({atom.kind.value}, "
                                 f"{atom.status.value})")
        ids = tuple(payload.get("attestations") or ())
        atts = _atts(lookup, ids, atom, Result.PASS)
        covered = {a.body.verifier for a in atts}
        missing = sorted(set(atom.required_verifiers) - covered)
        if missing:
            raise PromotionError(f"no PASS attestation for required verifier(s): {missing}")
        if atom.work_item and atom.tree_hash:
            disputed = sorted(set(atom.required_verifiers) &
                              atoms.failed(atom.work_item, atom.tree_hash))
            if disputed:
                raise PromotionError(f"required verifier(s) {disputed} have an attested FAIL "
                                     "for this work item on this tree: the evidence disagrees")
        return Change(atom.model_copy(update={"status": AtomStatus.PROMOTED,
                                              "attestations": ids, "updated_at": at}))
    if kind == "demote":
        if atom.status is not AtomStatus.PROMOTED or atom.kind is not AtomKind.ASSERT or \
                atom.references:
            raise PromotionError(f"atom {atom_id[:16]} is not a PROMOTED claim")
        att_id = str(payload.get("attestation", ""))
        (fail,) = _atts(lookup, [att_id], atom, Result.FAIL)
        if fail.body.verifier not in atom.required_verifiers:
            raise PromotionError(f"verifier {fail.body.verifier!r} is not required by "
                                 f"claim {atom_id[:16]}")
        return Change(atom.model_copy(update={"status": AtomStatus.DEMOTED, "updated_at": at,
                                              "attestations": (*atom.attestations, att_id)}),
                      frozenset({fail.body.verifier}))
    raise PromotionError(f"unknown AHDB event kind {kind!r}")


def _check_assert(atoms: State, atom: Atom) -> None:
    if atom.kind is not AtomKind.ASSERT or atom.status is not AtomStatus.PROMOTED:
        raise PromotionError("an ASSERT is written PROMOTED, over promoted claims")
    if not atom.references:
        raise PromotionError("ASSERT without references: only attestations promote")
    evidence: list[str] = []
    for ref in atom.references:
        claim = atoms.get(ref)
        if claim is None or claim.status is not AtomStatus.PROMOTED or \
                claim.kind is not AtomKind.ASSERT or claim.references:
            raise PromotionError(f"ASSERT references {ref[:16]}, which is not a PROMOTED claim")
        if claim.work_item != atom.work_item or claim.tree_hash != atom.tree_hash:
            raise PromotionError(f"claim {ref[:16]} is for another work item or tree")
        evidence.extend(claim.attestations)
    if sorted(set(evidence)) != sorted(set(atom.attestations)):
        raise PromotionError("an ASSERT carries exactly its claims' attestations")
