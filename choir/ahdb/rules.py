"""The promotion rules (docs/concepts.md), as one function over (state, event).

Every write to the AHDB passes through ``apply`` before it is appended, and ``choir audit``
replays the whole log through the same function (``replay``), so a row inserted behind the
store's back is caught exactly as a forbidden write would have been refused.

- ASSERT claims are PROPOSED with the verifiers they need (never none: no verifier, no assert).
- promote: every attestation valid and trusted, PASS, for the same tree (and commit), covering
  every required verifier, none of which has an attested FAIL on that tree on record (an
  outcome, a HYPOTHESIZE or a demotion; from ``choir verify``, this work item's run or any
  other's). A tree does not change, so a later PASS of the same verifier is disagreement:
  FLAKY evidence, which never promotes, however many PASSes follow (a newer PASS is exactly
  what a verifier that fails once and then passes produces).
- a live claim never stands beside such a FAIL: the FAIL's outcome demotes it in the same
  transaction, and ``choir audit`` names one that does (``disputed``, the same function).
- a work-item ASSERT references only PROMOTED claims of the same work item and tree.
- demote: a valid FAIL attestation for the same tree, of a verifier the claim requires.
- HYPOTHESIZE: valid FAIL attestations for that tree and a discriminating test.
- HYPERTHESIS: a disclosure; it can never be promoted or referenced.
- resolve: a later round marks a HYPOTHESIZE (still PROPOSED) confirmed or refuted by a
  valid PASS attestation of a verifier it explains, for the same work item: on a later tree,
  the failure it explained is gone (confirmed: PROMOTED); on its own tree, the failure did
  not reproduce (refuted: DEMOTED; the verifier disagrees with itself, not the change).
- outcome: a valid attestation's result, written when it is minted; it changes no atom, so
  audit can require that every stored attestation appears in the log (anchoring).
- integrate: an item's merge into a plan's integration branch, kept after the integration
  round: the item's live ASSERT for exactly the merged tree, and the plan's live ASSERT for
  the integration tree that round verified (trees, as the gate binds them).
- release: a plan's promotion (``choir promote``: a branch moved to the integration commit);
  it names the plan's live ASSERT for exactly that tree and each item's live
  ASSERT, every claim behind them still PROMOTED and undisputed. It changes no atom: it is
  the record that a global effect happened, and on what evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from choir.exceptions import PromotionError
from choir.models import Atom, AtomKind, AtomStatus, Attestation, Result

# attestation id -> the attestation, or raises PromotionError when missing/invalid/untrusted
Lookup = Callable[[str], Attestation]


# (work item, or "" for ``choir verify``; tree hash; verifier): one attested FAIL on record
Fail = tuple[str, str, str]


class State(Protocol):
    """What the rules read: atoms by id and the attested FAILs on record per tree.

    The store answers from its materialised tables (indexed: a write costs the same at 1,000
    or 100,000 events); audit answers from a replay of the log (``Replay``).
    """

    def get(self, atom_id: str) -> Atom | None: ...

    def failed(self, tree_hash: str) -> set[str]:
        """Verifiers with an attested FAIL on ``tree_hash`` on record, whoever asked."""
        ...

    def has_outcome(self, attestation_id: str) -> bool: ...

    def declared(self, plan: str) -> frozenset[str] | None:
        """The items ``plan``'s ``plan`` event declared; None before it (or without one)."""
        ...


class Recorder(State, Protocol):
    """A ``State`` that takes each allowed change in turn (the tables, or a ``Replay``)."""

    def record(self, change: Change, seq: int) -> None: ...


class Logged(Protocol):
    """What a replay reads of one stored event (``choir.ahdb.store.Event``)."""

    @property
    def seq(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def payload(self) -> Any: ...
    @property
    def created_at(self) -> str: ...


@dataclass(frozen=True)
class Change:
    """What one allowed event does: the atom it writes, the FAILs it puts on record."""

    atom: Atom | None
    fails: frozenset[Fail] = frozenset()
    outcome: str | None = None
    plan: tuple[str, frozenset[str]] | None = None


class Replay:
    """``State`` held in memory, built by applying events in order (audit, tests)."""

    def __init__(self) -> None:
        self.atoms: dict[str, Atom] = {}
        self.fails: set[Fail] = set()
        self.outcomes: set[str] = set()
        self.plans: dict[str, frozenset[str]] = {}

    def get(self, atom_id: str) -> Atom | None:
        return self.atoms.get(atom_id)

    def failed(self, tree_hash: str) -> set[str]:
        return {v for _, t, v in self.fails if t == tree_hash}

    def has_outcome(self, attestation_id: str) -> bool:
        return attestation_id in self.outcomes

    def declared(self, plan: str) -> frozenset[str] | None:
        return self.plans.get(plan)

    def record(self, change: Change, seq: int = 0) -> None:
        if change.outcome:
            self.outcomes.add(change.outcome)
        if change.plan:
            self.plans[change.plan[0]] = change.plan[1]
        self.fails |= change.fails
        if change.atom is not None:
            self.atoms[change.atom.id] = change.atom


def fails_of(atts: list[Attestation]) -> frozenset[Fail]:
    """The FAILs ``atts`` put on record, keyed by their own target (not the citing atom)."""
    return frozenset((a.body.target.work_item or "", a.body.target.tree_hash, a.body.verifier)
                     for a in atts if a.body.result is Result.FAIL)


def disputed(state: State, claim: Atom) -> list[str]:
    """The verifiers ``claim`` requires that have an attested FAIL on its tree on record.

    The one test both sides use: the write path refuses to promote such a claim, and audit
    names a live one (``ahdb_contradicted``).
    """
    if not claim.tree_hash:
        return []
    return sorted(set(claim.required_verifiers) & state.failed(claim.tree_hash))


def replay(events: Iterable[Logged], state: Recorder, lookup: Lookup,
           refused: Callable[[Logged, Exception], None]) -> None:
    """Apply ``events`` in order to ``state``; an event the rules refuse changes nothing and
    goes to ``refused``. The store derives its tables this way; audit, its ``Replay``."""
    for ev in events:
        try:
            change = apply(state, ev.kind, ev.payload, datetime.fromisoformat(ev.created_at),
                           lookup)
        except (PromotionError, ValueError, KeyError, TypeError, AttributeError) as exc:
            refused(ev, exc)
            continue
        state.record(change, ev.seq)


def live_assert(state: State, candidates: Iterable[Atom],
                commit_sha: str | None = None) -> Atom | None:
    """The first of ``candidates`` (PROMOTED ASSERTs, latest first) that is a live work-item
    ASSERT (of ``commit_sha``, when given): every claim behind it still PROMOTED in
    ``state``."""
    for atom in candidates:
        if not atom.references or (commit_sha and atom.commit_sha != commit_sha):
            continue
        claims = [state.get(r) for r in atom.references]
        if all(c is not None and c.status is AtomStatus.PROMOTED for c in claims):
            return atom
    return None


def dead_asserts(atoms: Iterable[Atom]) -> set[str]:
    """The PROMOTED ASSERTs of ``atoms`` that are not live: a claim behind one was demoted
    (an attested FAIL of the same verifier on the tree), or is not among ``atoms``. The gate
    refuses them (``live_assert``): ``choir view`` and ``choir ahdb list`` must not show
    them as they show a live one (review 17c)."""
    atoms = list(atoms)
    status = {a.id: a.status for a in atoms}
    return {a.id for a in atoms
            if a.kind is AtomKind.ASSERT and a.status is AtomStatus.PROMOTED and a.references
            and any(status.get(r) is not AtomStatus.PROMOTED for r in a.references)}


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
    if not isinstance(payload, dict):
        raise PromotionError(f"an AHDB {kind!r} event's payload is not an object")
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
            return Change(atom, fails_of(_atts(lookup, atom.attestations, atom, Result.FAIL)))
        else:
            if atom.kind is not AtomKind.HYPERTHESIS or atom.status is not AtomStatus.PROPOSED:
                raise PromotionError("HYPERTHESIS is a PROPOSED disclosure, nothing more")
            _atts(lookup, atom.attestations, atom, None)
        return Change(atom)
    if kind == "outcome":
        att_id = str(payload.get("attestation", ""))
        if atoms.has_outcome(att_id):
            raise PromotionError(f"the outcome of {att_id[:16]} is already recorded")
        # a FAIL blocks promotion on its tree whether or not a claim was live to demote
        return Change(None, fails_of([lookup(att_id)]), outcome=att_id)
    if kind in ("release", "integrate"):
        (_check_release if kind == "release" else _check_integrate)(atoms, payload)
        return Change(None)
    if kind == "plan":
        return Change(None, plan=_check_plan(atoms, payload))
    atom_id = payload.get("atom_id", "")
    found = atoms.get(atom_id)
    if found is None:
        raise PromotionError(f"no atom {atom_id}")
    atom = found
    if kind == "resolve":
        return _resolve(atom, payload, at, lookup)
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
        against = disputed(atoms, atom)
        if against:
            raise PromotionError(f"required verifier(s) {against} have an attested FAIL "
                                 "on this tree: the evidence disagrees")
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
                      fails_of([fail]))
    raise PromotionError(f"unknown AHDB event kind {kind!r}")


def resolution(hypothesis: Atom, evidence: Attestation) -> str:
    """``confirmed`` or ``refuted``: what a PASS says about a hypothesis, by its tree."""
    return "refuted" if evidence.body.target.tree_hash == hypothesis.tree_hash else "confirmed"


def _resolve(atom: Atom, payload: dict[str, Any], at: datetime, lookup: Lookup) -> Change:
    if atom.kind is not AtomKind.HYPOTHESIZE or atom.status is not AtomStatus.PROPOSED:
        raise PromotionError(f"atom {atom.id[:16]} is not an open HYPOTHESIZE")
    att_id = str(payload.get("attestation", ""))
    evidence = lookup(att_id)
    if evidence.body.result is not Result.PASS:
        raise PromotionError(f"attestation {att_id[:16]} is {evidence.body.result.value}, "
                             "not PASS")
    if (evidence.body.target.work_item or None) != (atom.work_item or None):
        raise PromotionError(f"attestation {att_id[:16]} is for another work item")
    if evidence.body.verifier not in {lookup(a).body.verifier for a in atom.attestations}:
        raise PromotionError(f"verifier {evidence.body.verifier!r} is not one the hypothesis "
                             "explains")
    verdict = resolution(atom, evidence)
    if payload.get("verdict") != verdict:
        raise PromotionError(f"the evidence says {verdict}, not {payload.get('verdict')!r}")
    status = AtomStatus.PROMOTED if verdict == "confirmed" else AtomStatus.DEMOTED
    return Change(atom.model_copy(update={"status": status, "updated_at": at,
                                          "attestations": (*atom.attestations, att_id)}))


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


def _live_assert(atoms: State, atom_id: str, work_item: str, what: str) -> Atom:
    """The work-item ASSERT ``atom_id`` of ``work_item``, every claim behind it standing."""
    atom = atoms.get(atom_id)
    if atom is None or atom.kind is not AtomKind.ASSERT or \
            atom.status is not AtomStatus.PROMOTED or not atom.references or \
            atom.work_item != work_item:
        raise PromotionError(f"{what}: {atom_id[:32]!r} is not a live ASSERT of {work_item!r}")
    for ref in atom.references:
        claim = atoms.get(ref)
        if claim is None or claim.status is not AtomStatus.PROMOTED or disputed(atoms, claim):
            raise PromotionError(f"{what}: the claim {ref[:16]} behind it no longer holds")
    return atom


def _asserted_for(atoms: State, atom_id: str, work_item: str, tree: str, what: str) -> None:
    """``atom_id`` is ``work_item``'s live ASSERT for exactly ``tree``.

    Bound by the tree, as the gate binds them: a tree does not change, and one verified
    tree may sit under several commits (an item that changed nothing, merged, leaves the
    integration tree as it was, under a new merge commit)."""
    atom = _live_assert(atoms, atom_id, work_item, what)
    if atom.tree_hash != tree:
        raise PromotionError(f"{what}: the ASSERT of {work_item} is for another tree")


def _check_release(atoms: State, payload: dict[str, Any]) -> None:
    plan = str(payload["plan"])
    what = f"release of plan {plan}"
    _asserted_for(atoms, str(payload["assert"]), plan, payload["tree_hash"], what)
    items = payload["items"]
    if not isinstance(items, dict) or not items:
        raise PromotionError(f"{what}: no item ASSERTs named")
    for work_item, atom_id in sorted(items.items()):
        if not str(work_item).startswith(f"{plan}."):
            raise PromotionError(f"{what}: {work_item!r} is not its item")
        _live_assert(atoms, str(atom_id), str(work_item), what)
    # Every item the plan declared is released with it (its split parts come on top); a
    # plan recorded before Choir declared its items has no list to hold it to.
    left_out = (atoms.declared(plan) or frozenset()) - {
        str(w).removeprefix(f"{plan}.") for w in items}
    if left_out:
        raise PromotionError(f"{what}: the plan declared item(s) {sorted(left_out)}, which "
                             "it does not release")


def _check_plan(atoms: State, payload: dict[str, Any]) -> tuple[str, frozenset[str]]:
    """A plan's items, declared when it starts, once: what its gate requires merged and
    its release names (review 19b: the driver's unsigned record was the only list, and
    dropping a failed item from it opened the gate)."""
    plan, items = str(payload.get("plan") or ""), payload.get("items")
    if not plan or not isinstance(items, list) or not items or \
            not all(isinstance(i, str) and i for i in items) or len(set(items)) != len(items):
        raise PromotionError("a plan event names its plan and its distinct items")
    if atoms.declared(plan) is not None:
        raise PromotionError(f"plan {plan} declared its items already")
    return plan, frozenset(items)


def _check_integrate(atoms: State, payload: dict[str, Any]) -> None:
    plan, item = str(payload["plan"]), str(payload["item"])
    what = f"merge of {item} into plan {plan}"
    if not item.startswith(f"{plan}."):
        raise PromotionError(f"{what}: {item!r} is not an item of the plan")
    _asserted_for(atoms, str(payload["assert"]), item, payload["tree_hash"], what)
    _asserted_for(atoms, str(payload["integration_assert"]), plan, payload["integration_tree"],
                  what)
