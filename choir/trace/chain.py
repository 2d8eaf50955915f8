"""The hash chain over a run's trace events, and the check of the seals signed over it.

Each event's canonical JSON (the ``TraceEvent`` as exported) extends a blake3 chain that
starts from the run id, so the head after event ``n`` fixes events 1..n: their content, their
order and their number. The recorder signs that head (``choir.verification.seal``) after each
node of the run; the same function below re-derives it from a stored record or an exported
trace, so ``choir audit`` and ``choir trace verify`` judge a trace by the very bytes that
were sealed. Events after the last seal are the unsealed tail a crash can leave: until a
resumed run seals them, nothing vouches for them, and the check says so by name.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from choir._core.canonical import blake3_hex, canonical_json
from choir.trace.model import TraceEvent
from choir.verification.seal import Seal, seal_problem

CHAIN_TYPE = "choir.trace-chain/v1"
FINAL_KINDS = ("run_ended", "awaiting_approval")


def chain_start(run_id: str) -> str:
    """The head before any event: bound to the run, so a chain cannot move to another."""
    return blake3_hex(canonical_json({"type": CHAIN_TYPE, "run_id": run_id}))


def chain_next(head: str, event: TraceEvent) -> str:
    return blake3_hex(head.encode("ascii") + b"\n" + canonical_json(event))


def chain_heads(run_id: str, events: Sequence[TraceEvent]) -> list[str]:
    """``heads[n]``: the head after the first ``n`` events (``heads[0]`` is the start)."""
    heads = [chain_start(run_id)]
    for event in events:
        heads.append(chain_next(heads[-1], event))
    return heads


def sealed_count(events: Sequence[TraceEvent], seals: Sequence[Seal]) -> int:
    """How many events, from the first, the last seal that fits the record covers."""
    return max((seal.seq for seal in seals if seal.seq <= len(events)), default=0)


def check_seals(run_id: str, events: Sequence[TraceEvent], seals: Sequence[Seal],
                trusted: Collection[str]) -> list[tuple[str, str, str]]:
    """(check, where, detail) for the first seal that does not hold and for an unsealed tail.

    ``seal_integrity``: a seal whose run is wrong, or whose events no longer hash to what it
    signed (one was changed, dropped, added or reordered, or the trace was cut short of it),
    or a seal's signature or key. ``seal_coverage``: events after the last seal. Every
    seal's digest is compared (a hash each); signatures are checked from the last seal back
    until one holds: the chain makes it vouch for every event before it, so an earlier seal
    only restates it.
    """
    heads = chain_heads(run_id, events)
    broken: list[tuple[str, str]] = []
    bound: list[tuple[str, Seal]] = []
    for n, seal in enumerate(seals):
        where = f"seals[{n}] (events 1..{seal.seq})"
        if not 1 <= seal.seq <= len(events):
            broken.append((where, f"seals {seal.seq} events, the trace holds {len(events)} "
                                  "(events were cut or dropped)"))
            continue
        problem = seal_problem(seal, kind="trace", subject=run_id, digest=heads[seal.seq],
                               trusted=None)
        if problem is None:
            bound.append((where, seal))
        else:
            broken.append((where, f"{problem} (an event up to seq {seal.seq} was changed, "
                                  "dropped, added or reordered)"
                           if problem.startswith("the record hashes") else problem))
    for where, seal in sorted(bound, key=lambda pair: -pair[1].seq):
        problem = seal_problem(seal, kind="trace", subject=run_id, digest=seal.digest,
                               trusted=trusted)
        if problem is None:
            break
        broken.append((where, problem))
    covered = sealed_count(events, seals)
    # one change breaks every later seal of the chain: the first one names it
    found = [("seal_integrity", where, detail + (f"; {len(broken) - 1} more seals fail"
                                                 if len(broken) > 1 else ""))
             for where, detail in broken[:1]]
    if covered < len(events):
        found.append(("seal_coverage", f"events[{covered}]",
                      f"events {covered + 1}..{len(events)} are not sealed (a crash, or a "
                      f"seal removed); `choir run --resume {run_id}` seals them"))
    return found
