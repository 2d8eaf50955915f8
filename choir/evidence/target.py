"""The Target evidence is bound to: a hashed tree, and its commit only when they are equal."""

from __future__ import annotations

from pathlib import Path

from choir.evidence.scan import Snapshot
from choir.evidence.tree import inspect_tree, snapshot
from choir.models import Target


def target_of(snap: Snapshot, work_item: str | None = None) -> Target:
    """The Target for a hashed tree: the commit only when the tree is exactly that commit's."""
    return Target(work_item=work_item, commit_sha=snap.commit_sha, tree_hash=snap.tree_hash,
                  tree_sha256=snap.sha256)


def resolve_target(repo: Path, work_item: str | None = None) -> Target:
    """The exact tree (and, when clean, commit) evidence will be bound to."""
    return target_of(inspect_tree(repo), work_item)


def snapshot_target(repo: Path, root: Path, work_item: str | None = None, *,
                    full: bool = False) -> tuple[Target, Path]:
    """Hash ``repo`` and seal exactly the hashed files into a snapshot, in one pass.

    Verifiers read the snapshot, never the live tree, so what they see is what the target
    names. The caller removes it (``remove_snapshot``) when done. ``full``: every file read
    again, no stat cache (PARANOID).
    """
    snap = snapshot(repo, root, full=full)
    assert snap.path is not None
    return target_of(snap, work_item), snap.path
