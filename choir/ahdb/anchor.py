"""Anchors outside the home: a pinned signed head, and the high-water mark a gate keeps.

Signed heads (``choir.ahdb.heads``) catch an edit of the log. They cannot catch a rollback:
someone who can write ``CHOIR_HOME`` cuts the log, the heads file and the attestations back
to an earlier state together, and every file there agrees with every other. Only a record
kept where that writer cannot reach tells the two states apart, so:

- ``choir ahdb head`` (or ``choir audit --export-head FILE`` after a clean audit) exports
  the latest signed head, a ``PinnedHead``; keep it outside the home (CI storage, another
  repo, another user's file);
- ``choir audit --expect-head FILE`` fails (``ahdb_rollback``, ``ahdb_anchor_mismatch``)
  when the log does not contain that head: it was cut back, or rewritten from before it;
- ``choir gate`` keeps a high-water mark per store in a file outside the home (``SeenHeads``)
  and refuses a store whose log no longer reaches, or no longer contains, the last head it
  saw; ``choir gate --expect-head FILE`` checks a pinned head the same way.

An anchor is only as strong as the place it is kept: a file the runner itself can write
(its own ``~/.config``) stops a careless rollback, not a determined one. Keep it where the
runner cannot write (see docs/security.md).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from choir._core import fsopen
from choir.ahdb.heads import Head, head_key_id, latest_signed, read_heads
from choir.exceptions import ConfigError, IntegrityError
from choir.models._base import Frozen

if TYPE_CHECKING:
    from choir.ahdb.store import AHDB, Event

class PinnedHead(Frozen):
    """One signed chain head, exported to be kept elsewhere: the log reached ``head`` at
    ``seq``. ``store`` says where it came from (a file path or a URL without password)."""

    type: Literal["choir.ahdb-pinned-head/v1"] = "choir.ahdb-pinned-head/v1"
    store: str
    seq: int
    head: str
    key_id: str
    public_key: str
    signature: str

    def as_head(self) -> Head:
        return Head(self.seq, self.head, self.key_id, self.public_key, self.signature)


def latest_head(db: AHDB, trusted_keys: Collection[str]) -> PinnedHead:
    """The latest signed head that the log honours, signed by a trusted key.

    An event past it was written without the key (``choir audit`` names it): the pin never
    covers one.

    Raises:
        IntegrityError: no signed head of a trusted key matches the log.
    """
    chain = {ev.seq: ev.event_hash for ev in db.events()}
    best = latest_signed(read_heads(db.backend.heads, db.backend.shared_heads()), chain,
                         trusted_keys)
    if best is None:
        raise IntegrityError(f"no signed head of a trusted key matches the AHDB at {db.where}"
                             " (is it empty? run `choir audit`)")
    return PinnedHead(store=db.where, seq=best.seq, head=best.head, key_id=best.key_id,
                      public_key=best.public_key, signature=best.signature)


def write_pin(pin: PinnedHead, path: Path) -> None:
    """Write ``pin`` to ``path`` (replacing it whole: a reader never sees half a file)."""
    fsopen.write_whole(path, (pin.model_dump_json(indent=2) + "\n").encode())


def load_pin(path: Path) -> PinnedHead:
    """The pinned head in ``path``.

    Raises:
        ConfigError: the file is missing, unreadable or not an exported head.
    """
    fix = "export one with `choir ahdb head --out FILE` (or `choir audit --export-head FILE`)"
    try:
        return PinnedHead.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read the pinned head: {exc.strerror or exc}",
                          path=str(path), hint=fix) from None
    except ValidationError as exc:
        raise ConfigError(f"not an exported AHDB head ({exc.error_count()} problem(s): "
                          f"{exc.errors()[0]['msg']})", path=str(path), hint=fix) from None


def check_pin(pin: PinnedHead, chain: dict[int, str], tail: int,
              trusted_keys: Collection[str]) -> list[tuple[str, str, str, str]]:
    """(kind, object, expected, found) when the log does not contain the pinned head."""
    where = f"pinned head at seq {pin.seq}"
    key_id = head_key_id(pin.as_head())
    if key_id is None:
        return [("ahdb_anchor_signature", where, "a valid signature", "invalid")]
    if key_id not in trusted_keys:
        return [("ahdb_anchor_untrusted_key", where, "a trusted key", key_id)]
    if pin.seq > tail:
        return [("ahdb_rollback", where, f"the log reaches seq {pin.seq}",
                 f"it ends at seq {tail}: cut back behind the pinned head")]
    if chain.get(pin.seq) != pin.head:
        return [("ahdb_anchor_mismatch", where, pin.head,
                 f"{chain.get(pin.seq, 'no such event')}: rewritten from before it")]
    return []


@dataclass(frozen=True)
class Mark:
    """A head this machine has seen: the log reached ``head`` at ``seq``."""

    seq: int
    head: str
    source: str  # for messages: the seen-heads file, or the pinned head file


def follow(events: Iterable[Event], marks: Iterable[Mark]) -> list[str]:
    """Why the log (``events`` from the lowest mark's seq on) does not extend every mark.

    Each mark's event must be there with its hash, and every later event must link to the
    one before it (``check_chain`` over the tail): a log cut back, or rewritten from before
    a mark, is refused. Costs the events since the oldest mark, not the whole log.
    """
    from choir.ahdb.store import event_hash

    wanted = {m.seq: m for m in marks}
    problems: list[str] = []
    prev: str | None = None
    tail = 0
    for ev in events:
        if prev is not None and (ev.prev_hash != prev or ev.seq != tail + 1):
            problems.append(f"the log is broken at seq {ev.seq}: run `choir audit`")
            break
        if event_hash(ev.prev_hash, ev.seq, ev.kind, ev.payload, ev.created_at) != \
                ev.event_hash:
            problems.append(f"event {ev.seq} does not hash to its recorded hash: "
                            "run `choir audit`")
            break
        mark = wanted.pop(ev.seq, None)
        if mark is not None and mark.head != ev.event_hash:
            problems.append(f"the log was rewritten from before seq {mark.seq}, a head seen "
                            f"in {mark.source}: the event there is not the one seen")
        prev, tail = ev.event_hash, ev.seq
    for mark in sorted(wanted.values(), key=lambda m: m.seq):
        # no event read at all: the log ends before the first mark (never "at seq 0")
        ends = f"at seq {tail}" if tail else "before it"
        problems.append(f"the log ends {ends}, behind seq {mark.seq}, a head seen in "
                        f"{mark.source}: it was rolled back")
    return problems


class SeenHeads:
    """The gate's high-water marks: store -> the last (seq, head) a gate saw there.

    A JSON object in one file outside the home, updated under an exclusive lock and
    replaced whole, and only ever moved forward.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @staticmethod
    def default_path() -> Path | None:
        """``CHOIR_SEEN_HEADS`` (empty: keep none), else ``$XDG_CONFIG_HOME/choir/seen-heads``
        (``~/.config/choir/seen-heads``)."""
        value = os.environ.get("CHOIR_SEEN_HEADS")
        if value is not None:
            return Path(value).expanduser() if value.strip() else None
        config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(config).expanduser() / "choir" / "seen-heads"

    def _read(self) -> dict[str, Any]:
        fix = (f"remove {self.path} to start again (every store's high-water mark is lost), "
               "or point CHOIR_SEEN_HEADS elsewhere")
        try:
            data = json.loads(self.path.read_bytes()) if self.path.exists() else {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"the seen-heads file is unreadable: {exc}", path=str(self.path),
                              hint=fix) from None
        if not isinstance(data, dict):
            raise ConfigError("the seen-heads file is not a JSON object", path=str(self.path),
                              hint=fix)
        return data

    def mark(self, store: str) -> Mark | None:
        entry = self._read().get(store)
        if not isinstance(entry, dict):
            return None
        try:
            return Mark(int(entry["seq"]), str(entry["head"]), str(self.path))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"the seen-heads entry for {store} is malformed",
                              path=str(self.path), hint=f"remove that entry from {self.path}"
                              ) from None

    def advance(self, store: str, seq: int, head: str) -> None:
        """Record (seq, head) for ``store`` unless a later head is already recorded."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._read()
            entry = data.get(store)
            if isinstance(entry, dict) and int(entry.get("seq", 0)) >= seq:
                return
            data[store] = {"seq": seq, "head": head}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, self.path)
