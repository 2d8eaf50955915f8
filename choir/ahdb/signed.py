"""What the signed log says: the state the gate and promotion answer from.

The store's tables are a cache, and anyone who can write the database can edit them (review
12, F2: one ``UPDATE atoms SET status='PROMOTED'`` reopened a gate that an attested FAIL had
closed). Events appended without the key are no better (F1: a forged ``assert`` opened the
gate). So a decision with an effect outside the store (``choir gate``, ``choir promote``)
reads neither: it re-hashes the whole chain, finds the latest head a trusted key signed that
the log honours (``heads.latest_signed``), refuses when any event lies past it, and replays
the events up to it through the write rules (``rules.replay``, the function audit uses) into
memory. The cost is one replay per decision; bench/gate_replay.py measures it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from choir.ahdb.heads import Head, head_key_id, parse
from choir.ahdb.rules import Logged, Lookup, Replay, live_assert, replay
from choir.exceptions import PromotionError
from choir.models import Atom, AtomKind, AtomStatus, Attestation, Result

if TYPE_CHECKING:
    from choir.ahdb.store import AHDB


def cached(lookup: Lookup, verified: dict[str, Attestation] | None = None) -> Lookup:
    """Verify each attestation once per replay: 100,000 events cite a few hundred of them.

    ``verified``: attestations already checked in full (id, signature, trusted key, every
    object), so the replay does not check them twice.
    """
    seen: dict[str, Attestation | PromotionError] = dict(verified or {})

    def once(att_id: str) -> Attestation:
        if att_id not in seen:
            try:
                seen[att_id] = lookup(att_id)
            except PromotionError as exc:
                seen[att_id] = exc
        got = seen[att_id]
        if isinstance(got, PromotionError):
            raise got
        return got

    return once


# attestation id -> the result its stored body claims (not checked), None when unreadable
Claimed = Callable[[str], Result | None]


def fail_closed(claimed: Claimed, problems: list[str]) -> Callable[[Logged, Exception], None]:
    """A replay's ``on_refused`` that adds to ``problems`` each refused event that would have
    put a FAIL on record or demoted a claim (``demote``, ``hypothesize``, an ``outcome`` not
    claiming PASS), the gate's replay and the tables' rebuild alike.

    Review 22b, F1: dropped silently, such an event put a demoted claim back, and the gate
    opened because a FAIL's attestation was removed, or its report lay in another job's
    ``CHOIR_ARTIFACT_DIR``. So the replay fails closed on it. A refused PASS-side event
    (``promote``, ``assert``, ``resolve``, an outcome whose stored body claims PASS: that
    body hashes to the id the signed log names) stays skipped: it can only keep a gate shut.
    """
    def note(ev: Logged, exc: Exception) -> None:
        if ev.kind == "outcome":
            payload = ev.payload if isinstance(ev.payload, dict) else {}
            if claimed(str(payload.get("attestation", ""))) is Result.PASS:
                return
        elif ev.kind not in ("demote", "hypothesize"):
            return
        problems.append(
            (f"AHDB event {ev.seq} ({ev.kind}): the FAIL's evidence cannot be checked: {exc}; "
             "restore its attestation, or point CHOIR_ARTIFACT_DIR at the store that holds "
             "its report (`choir audit` names what is missing)")[:600])

    return note


@dataclass
class SignedLog:
    """The state the log implies up to its latest trusted signed head, and why it is not
    to be relied on (``problems``: a broken chain, events past that head)."""

    head: tuple[int, str]
    state: Replay = field(default_factory=Replay)
    problems: list[str] = field(default_factory=list)

    def asserted(self, work_item: str, tree_hash: str | None = None,
                 commit_sha: str | None = None) -> Atom | None:
        """``AHDB.is_asserted``, answered by the replay; None while there are problems."""
        if self.problems:
            return None
        candidates = [a for a in self.state.atoms.values()
                      if a.kind is AtomKind.ASSERT and a.status is AtomStatus.PROMOTED and
                      a.work_item == work_item and (not tree_hash or a.tree_hash == tree_hash)]
        return live_assert(self.state, reversed(candidates), commit_sha)


def _why_not(db: AHDB, trusted_keys: Collection[str]) -> str:
    """Whose key signed the last head, when one did but is not trusted (revoked, or not
    pinned); else: nobody's."""
    last = db.backend.last_head()
    found = parse(last) if last is not None else None
    if isinstance(found, Head):
        key_id = head_key_id(found)
        if key_id is not None and key_id not in trusted_keys:
            return f"the last head, at seq {found.seq}, is signed by key {key_id}, which is " \
                "not trusted: revoked, or not pinned"
    return "written without the key"


@dataclass
class _Memo:
    """A log this process has replayed up to a trusted signed head (``seq``, ``head``)."""

    seq: int
    head: str
    state: Replay
    lookup: Lookup


_memos: dict[tuple[str, frozenset[str]], _Memo] = {}
_memo_lock = threading.Lock()


def read_signed(db: AHDB, trusted_keys: Collection[str]) -> SignedLog:
    """Replay ``db``'s log up to the latest head signed by one of ``trusted_keys``.

    Fails closed: a broken link, or an event no trusted signed head covers, is a problem,
    and ``asserted`` then answers nothing. Events past the head are refused rather than
    ignored: an honest writer refuses to extend such a log, so the FAILs that would demote
    an ASSERT may be missing from it.

    A process that asks again (the plan driver gates every landing) replays only what was
    signed since: the events after the head it replayed last must link to that head's hash,
    which must still be in the log; otherwise (a log cut back or rewritten) it starts over.
    """
    key = (db.identity(), frozenset(trusted_keys))
    with _memo_lock:
        memo = _memos.get(key)
        if memo is not None and _hash_at(db, memo.seq) != memo.head:
            memo = None
        signed = _read(db, trusted_keys, memo)
        if signed.memo is not None:  # replayed up to a trusted signed head
            _memos[key] = signed.memo
        else:  # not remembered: the next read starts over (an attestation may be restored)
            _memos.pop(key, None)
        state = signed.copy()
        _unlogged_fails(db, state, trusted_keys)
        return SignedLog(signed.head, state, signed.problems)


def _unlogged_fails(db: AHDB, state: Replay, trusted_keys: Collection[str]) -> None:
    """Put on record in ``state`` every stored, valid FAIL a trusted key signed whose
    outcome the log lacks, demoting the claims it hits, as its ``record_outcome`` would have.

    Review 22b, F2: ``mint_attestation`` stores the attestation, then logs its outcome; a
    kill -9 or a full disk between the two left a FAIL the log never saw, the gate stayed
    open on the tree that FAILs, and a later PASS there promoted. The cost is a listing of
    the store's ids and a check of those no outcome names (normally none). The store's own
    tables are not touched: ``choir audit`` names the missing outcome (``ahdb_outcome_missing``).
    """
    for att in db.unlogged_fails(state.outcomes):
        if att.signer_key_id not in trusted_keys:
            continue
        tree, verifier = att.body.target.tree_hash, att.body.verifier
        state.fails.add((att.body.target.work_item or "", tree, verifier))
        for atom in list(state.atoms.values()):
            if atom.kind is AtomKind.ASSERT and atom.status is AtomStatus.PROMOTED and \
                    not atom.references and atom.tree_hash == tree and \
                    verifier in atom.required_verifiers:
                state.atoms[atom.id] = atom.model_copy(update={"status": AtomStatus.DEMOTED})


def _hash_at(db: AHDB, seq: int) -> str | None:
    row = db._conn().execute("SELECT event_hash FROM events WHERE seq = ?", (seq,)).fetchone()
    return str(row[0]) if row else None


@dataclass
class _Read:
    head: tuple[int, str]
    state: Replay
    problems: list[str]
    memo: _Memo | None = None

    def copy(self) -> Replay:
        """The state, apart from the memo's (which the next read goes on replaying into)."""
        out = Replay()
        out.atoms, out.fails = dict(self.state.atoms), set(self.state.fails)
        out.outcomes = set(self.state.outcomes)
        return out


def _read(db: AHDB, trusted_keys: Collection[str], memo: _Memo | None) -> _Read:
    from choir.ahdb.store import GENESIS, check_chain

    after = (memo.seq, memo.head) if memo else (0, GENESIS)
    events = list(db.events(since=after[0] + 1))
    broken = check_chain(events, after)
    if broken:
        seq, what = broken[0][:2]
        return _Read((0, ""), Replay(), [f"the AHDB log is broken at seq {seq} ({what}): "
                                         "run `choir audit`"])
    head = db.signed_head(trusted_keys)
    if memo is not None and head[0] < memo.seq:  # no longer trusted as far: start over
        return _read(db, trusted_keys, None)
    problems = []
    if events and events[-1].seq > head[0]:
        problems.append(
            f"AHDB events {head[0] + 1}..{events[-1].seq} are not covered by a trusted signed "
            f"head ({_why_not(db, trusted_keys)}): run `choir audit`")
    state = memo.state if memo else Replay()
    lookup = memo.lookup if memo else cached(db.attestation)
    refused: list[str] = []
    replay([ev for ev in events if ev.seq <= head[0]], state, lookup,
           fail_closed(db.claimed_result, refused))
    if refused:  # remembered by no one: the memo's state went on past what it says
        return _Read(head, state, problems + refused)
    return _Read(head, state, problems, _Memo(head[0], head[1], state, lookup))
