"""The mark a ``choir run`` leaves on its work item's id before its executor starts
(``CHOIR_HOME/items/ID``): from then on no claim may be recorded under that id
(``choir.app.claim``), though the AHDB holds nothing of the run until its first round ends
(review 22b, F3)."""

from __future__ import annotations

import os
from pathlib import Path

from choir._core import fsopen
from choir._core.paths import choir_home


def _begun_path(item_id: str) -> Path:
    return choir_home() / "items" / item_id


def mark_run_begun(item_id: str, run_id: str) -> bool:
    """Before a ``choir run`` of ``item_id`` starts its executor: the id is a run's from now
    on. Until a round's HYPOTHESIZE or ASSERT the AHDB holds nothing of the run
    (``AHDB.run_recorded``), and round 1's executor, an agent with ``choir mcp``'s verify,
    could claim the item's own id in the mood it chose (review 22b, F3). The mark lies in
    ``CHOIR_HOME``, which the executor's sandbox masks. True when this call made it."""
    path = _begun_path(item_id)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:  # made here or not at all: two runs of one id never both take it as theirs
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(run_id + "\n")
    return True


def unmark_run_begun(item_id: str) -> None:
    """Take back ``mark_run_begun``'s mark: the run was refused before anything ran."""
    _begun_path(item_id).unlink(missing_ok=True)


def run_begun(name: str) -> str | None:
    """The id of the ``choir run`` of work item ``name`` that marked it begun, if one did
    (``mark_run_begun``); "?" when the mark cannot be read (fail closed)."""
    try:  # a FIFO or a huge file planted in the home is never waited on or read whole
        data = fsopen.read_bytes(_begun_path(name).parent, name, 256)
    except FileNotFoundError:
        return None
    except OSError:
        return "?"
    return data.decode("utf-8", "replace").strip() or "?"
