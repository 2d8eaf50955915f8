"""The AHDB: Choir's control state, where only attestations promote claims."""

from choir.ahdb.store import AHDB, Event, check_chain, event_hash, open_ahdb

__all__ = ["AHDB", "Event", "check_chain", "event_hash", "open_ahdb"]
