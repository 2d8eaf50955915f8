"""Crash points for tests: ``CHOIR_FAILPOINT=NAME`` SIGKILLs the process at ``failpoint(NAME)``.

Resuming after ``kill -9`` must never double-count an attempt or mint duplicate evidence,
wherever the kill lands. Timing a kill from outside only reaches the slow points (a running
executor, a sleeping verifier); these named points reach the narrow windows between a side
effect (an AHDB write, a minted attestation) and the checkpoint that records it. Unset, a
failpoint costs one environment lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "CHOIR_FAILPOINT"
POINTS = (
    "ahdb:committed",       # an AHDB write (event and its signed head) is committed; the
                            # head's copy in the file beside the database is not written
    "execute:done",         # the executor changed the tree; the attempt is not checkpointed
    "green:ran",            # a verifier's run is sealed; its report is not made
    "attest:minted",        # attestations are stored; the node has not returned
    "adjudicate:written",   # the AHDB holds this round's atoms; the decision is not saved
    "trace:sealing",        # a node's trace events are written; their seal is not
    "plan:committed",       # an item's run ended ASSERTed and is committed; not checkpointed
    "plan:built",           # a queue head is merged and checked out; not checkpointed
    "plan:integrated",      # a merge's integrate event is written; the branch has not moved
    "plan:landed",          # the integration branch moved; the plan's step is not checkpointed
    "plan:released",        # a promotion's release event is written; the branch has not moved
)


def failpoint(name: str) -> None:
    """Die here, as ``kill -9`` would, when ``CHOIR_FAILPOINT`` names this point."""
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
