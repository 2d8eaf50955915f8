"""Durable runs: the orchestrator over a checkpoint saver (SQLite under ``CHOIR_HOME``, or
Postgres with ``CHOIR_DATABASE_URL``: ``choir.graph.checkpoints``).

Every step's checkpoint is written before the next step starts (``durability="sync"``), so
after a crash ``resume(run_id)`` continues from the last finished step; ``approve`` answers a
human-approval interrupt and finishes the run. One process drives a run at a time (a lease,
``choir.graph.lease``): a second ``--resume`` of a run that is still being driven is refused, or
waits for the lease with ``CHOIR_LEASE_WAIT_S``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from choir._core.ids import new_run_id
from choir._core.paths import choir_home
from choir.attest.keys import require_pinned_signer
from choir.config import load_repo_config, load_work_item
from choir.config.policy import load_packaged_policy, load_policy, with_run_checks
from choir.director.split import part_feedback
from choir.evidence.spec import pin_spec
from choir.evidence.tree import remove_snapshot, snapshot_root
from choir.exceptions import UserError
from choir.graph.checkpoints import open_checkpointer
from choir.graph.orchestrator import build, run_snapshots
from choir.models import Mood, Usage, VerificationReport, WorkItem
from choir.telemetry import end_under, span
from choir.trace.record import TraceRecorder
from choir.verification import open_sandbox

# (kind, data): a node's state update (kind = node name), or live progress (kind = "progress")
OnEvent = Callable[[str, dict[str, Any]], None]


@dataclass
class RunOutcome:
    run_id: str
    status: str
    reason: str = ""
    attempt: int = 0
    mood: str = ""
    asserted: str = ""
    work_item: str = ""
    events: list[str] = field(default_factory=list)
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)
    waiting: bool = False
    question: dict[str, Any] = field(default_factory=dict)  # what the approval gate asks
    # status "split" (a plan item's run): each part, with the reports about its piece
    parts: list[tuple[WorkItem, list[VerificationReport]]] = field(default_factory=list)
    floor: list[str] = field(default_factory=list)  # verifiers its rounds ran: never dropped

    def exit_code(self) -> int:
        return {"asserted": 0, "awaiting_approval": 3}.get(self.status, 1)


def spend_by_role(usage: list[tuple[str, Usage]]) -> dict[str, dict[str, Any]]:
    """Tokens, cost and calls per role (executor, reporter, director), and the run's total."""
    out: dict[str, dict[str, Any]] = {}
    for role, spent in usage:
        for name in (role, "total"):
            row = out.setdefault(name, {"calls": 0, "prompt_tokens": 0,
                                        "completion_tokens": 0, "cost_usd": 0.0})
            row["calls"] += 1
            row["prompt_tokens"] += spent.prompt_tokens
            row["completion_tokens"] += spent.completion_tokens
            row["cost_usd"] = round(row["cost_usd"] + spent.cost_usd, 6)
    return out


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@contextlib.contextmanager
def _driving(run_id: str) -> Iterator[None]:
    """Hold the run's lease while driving it (``choir.graph.lease``): a second driver is refused
    (exit 2) or, with ``CHOIR_LEASE_WAIT_S``, waits for it."""
    from choir.graph.lease import hold_lease

    if not _RUN_ID.match(run_id) or ".." in run_id:
        raise UserError(f"invalid run id {run_id!r}: up to 100 letters, digits, '.', '_', '-'")
    with hold_lease(choir_home(), run_id):
        yield


async def _drive(graph_input: Any, run_id: str, on_event: OnEvent | None) -> RunOutcome:

    home = choir_home()
    home.mkdir(parents=True, exist_ok=True)
    require_pinned_signer()  # attestations by an unpinned key could never promote anything
    with _driving(run_id):
        async with open_checkpointer(home) as saver:
            graph = build().compile(checkpointer=saver)
            cfg: Any = {"configurable": {"thread_id": run_id}, "recursion_limit": 10_000}
            state = await graph.aget_state(cfg)
            exists = bool(state.values)
            if not isinstance(graph_input, dict) and not exists:  # a resume or an answer
                raise UserError(f"no run {run_id} to resume under {home}")
            if graph_input is not None and not isinstance(graph_input, dict) and not any(
                    task.interrupts for task in state.tasks):  # an answer no run asked for
                raise UserError(f"run {run_id} is not waiting for approval (`choir runs show "
                                f"{run_id}` says where it is); nothing was changed")
            if isinstance(graph_input, dict) and exists:
                raise UserError(f"run id {run_id} is taken; choir run --resume {run_id} "
                                "continues it, or give another --run-id")
            trace = TraceRecorder(run_id)  # every run records its trace (choir.trace)
            trace.started(graph_input)
            with span("choir.run", {"choir.run_id": run_id}, key=run_id) as root:
                snap = await _stream(graph, graph_input, cfg, trace, on_event, run_id)
                values = snap.values or {}
                item = values.get("work_item")
                root.set({"choir.status": values.get("status", "unknown"),
                          "choir.mood": values.get("mood"),
                          "choir.attempt": values.get("attempt"),
                          "choir.work_item": item.id if item is not None else None})
            insufficient = trace.ended(values, waiting=bool(snap.next))
        # the run's snapshots and views are no longer needed (its tree goes back to the
        # pool): removed while the run's lease is held, or a `choir approve` waiting for it
        # would verify in the folder as it is emptied (review 16g)
        remove_snapshot(run_snapshots(run_id))
    item = values.get("work_item")
    return RunOutcome(run_id=run_id, status=values.get("status", "unknown"),
                      reason=values.get("reason", ""), attempt=values.get("attempt", 0),
                      mood=values.get("mood", ""), asserted=values.get("asserted", ""),
                      work_item=item.id if item is not None else "",
                      events=[*values.get("events", []),
                              *([f"insufficient evidence: {insufficient}"] if insufficient
                                else [])],
                      usage=spend_by_role(values.get("usage", [])), waiting=bool(snap.next),
                      question=_question(snap), parts=_handed_back(values),
                      floor=list(values.get("floor", [])))


async def _stream(graph: Any, graph_input: Any, cfg: Any, trace: TraceRecorder,
                  on_event: OnEvent | None, run_id: str) -> Any:
    """Drive the graph to its next stop and return its state; a round left open (an approval
    gate, a failure) has its span closed here."""
    try:
        async for namespace, mode, data in graph.astream(
                graph_input, cfg, stream_mode=["updates", "custom"], subgraphs=True,
                durability="sync"):
            if mode == "custom":
                if on_event is not None:
                    on_event("progress", data)
            elif not namespace:
                for node, update in data.items():
                    if isinstance(update, dict):
                        trace.node(node, update)
                        if on_event is not None:
                            on_event(node, update)
    except Exception as exc:  # the trace ends with the error, not mid-air
        trace.failed(exc)
        raise
    finally:
        end_under(f"{run_id}-r")
    return await graph.aget_state(cfg)


def _handed_back(values: dict[str, Any]) -> list[tuple[WorkItem, list[VerificationReport]]]:
    """A split a plan item's run handed back: each part with its piece's reports."""
    if values.get("status") != "split":
        return []
    reports = list(values.get("feedback", []))
    return [(part, part_feedback(part, reports)) for part in values.get("parts", [])]


def _question(snap: Any) -> dict[str, Any]:
    """The pending approval interrupt's payload (a held spec change carries its diff)."""
    for task in getattr(snap, "tasks", ()):
        for pending in getattr(task, "interrupts", ()):
            if isinstance(pending.value, dict):
                return dict(pending.value)
    return {}


def _no_claim_under(item_id: str) -> None:
    """Refuse a run of a work item whose id a claim holds (``choir verify --claim``, an
    agent's verify over MCP): the gate for the id would answer for that claim, verified
    in whatever mood and by whichever verifiers it ran, never the item's own, and without
    its approval. (A plan's ids hold a ``.``, which no claim named by hand may: a plan keeps
    its own, ``choir.team.driver._claims_free``.)

    Raises:
        UserError: the AHDB holds such a claim.
    """
    from choir.ahdb import open_ahdb

    if "." not in item_id and open_ahdb().claim_recorded(item_id):
        raise UserError(f"work item {item_id}: the AHDB holds a claim of that name, recorded "
                        "by `choir verify --claim` or an agent's verify over MCP; `choir gate "
                        f"{item_id}` would answer for it, not for this item's runs\n"
                        "  fix: give the work item another id")


def _mark_begun(item_id: str, run_id: str) -> None:
    """Mark the item's id a run's before its executor starts (``choir.app.claim``: no claim
    may be recorded under it from now on), then look for a claim once more: one recorded
    since ``_no_claim_under`` looked refuses the run, and the mark it made is taken back.

    Raises:
        UserError: the AHDB holds a claim of the item's id.
    """
    from choir.graph.begun import mark_run_begun, unmark_run_begun

    made = mark_run_begun(item_id, run_id)
    try:
        _no_claim_under(item_id)
    except UserError:
        if made:
            unmark_run_begun(item_id)
        raise


async def run_work_item(path: Path, *, mood: Mood | None = None, run_id: str | None = None,
                        on_event: OnEvent | None = None,
                        hand_back_splits: bool = False, part: bool = False) -> RunOutcome:
    """Run a work item file until ASSERT, halt, budget end or an approval gate.

    ``hand_back_splits``: a split ends the run (status ``split``) with its parts in the
    outcome, for a plan to run as items of their own (``choir.team``); ``part``: the file is
    such a part (its id holds ``~``).

    Raises:
        UserError: a bad work item or ``choir.yaml``, a sandbox the mood refuses, or a run id
            that is already taken.
    """

    _item_unwritten(path, None)  # an executor's rewrite of it, before anything of it is read
    item = load_work_item(path, part=part)
    _no_claim_under(item.id)
    packaged = load_packaged_policy()
    # PARANOID: a verified trace; configuration errors before anything runs
    config = with_run_checks(load_repo_config(Path(item.repo)), packaged)
    inside = _item_unwritten(path, item)
    if inside is not None:  # pinned as a spec file: read-only to the executor, never changed
        config = config.model_copy(update={"spec": (*config.spec, "/" + inside)})
    policy = load_policy(config, packaged)
    start_mood = mood or item.mood
    open_sandbox(config, policy, start_mood).close()  # a refused sandbox before anything runs
    run_id = run_id or new_run_id(item.id)
    # the checks that define success, as they are before the executor runs (the base tree)
    spec = pin_spec(Path(item.repo), config.spec, snapshot_root())
    _no_executor_checks(Path(item.repo), spec)
    # and its Python sources, when a mood checks the change by mutating it
    base = pin_spec(Path(item.repo), ("*.py",), snapshot_root()) if any(
        s.mutates for s in config.verifiers.values()) else None
    _mark_begun(item.id, run_id)
    start = {"work_item": item, "config": config, "policy": policy, "run_id": run_id,
             "spec": spec, "base": base,
             "mood": start_mood.value, "attempt": 0, "round": 0, "history": [],
             "status": "running", "hand_back": hand_back_splits}
    return await _drive(start, run_id, on_event)


def _item_unwritten(path: Path, item: WorkItem | None) -> str | None:
    """Refuse a work item file an executor may have written (review 21d: run 1's executor
    rewrote its in-repo item from PARANOID to CALM, or to ``sandbox: none``; run 2 ran on
    its terms). ``item`` None: before it is parsed, against every folder above it an
    executor ran in; else against its repo. Returns the file's path in its repo when it
    lies there (to pin it, so no round may change it), else None.

    Raises:
        UserError: the file is not HEAD's, an executor committed or wrote it, or its
            ``may_change_spec`` lets the executor change it.
    """
    from choir.evidence import leftovers
    from choir.evidence.spec import matcher

    if item is None:
        for repo in leftovers.repos_above(path):
            leftovers.check_item(repo, path)
        return None
    repo = Path(item.repo).resolve()
    file = path.expanduser().resolve()
    if not file.is_relative_to(repo):
        return None
    leftovers.check_item(repo, path)
    rel = file.relative_to(repo).as_posix()
    why = ("its name holds a glob character" if any(c in rel for c in "*?[]\\") else
           "its may_change_spec names it" if matcher(item.may_change_spec)(rel) else None)
    if why is not None:
        raise UserError(f"work item {path}: it lies inside its repo {repo}, and {why}: its "
                        "executor could change the item it runs under\n"
                        "  fix: keep the work item outside the repo, or narrow may_change_spec")
    return rel


def _no_executor_checks(repo: Path, spec: str) -> None:
    """A check an earlier run's executor left in the tree is not the repo's own (review
    20c: a planted ``conftest.py`` its run refused was pinned by the next run, ASSERTed)."""
    from functools import partial

    from choir.evidence import leftovers
    from choir.evidence.artifacts import ArtifactStore
    from choir.evidence.spec import load_manifest, pinned_bytes

    store = ArtifactStore()
    leftovers.check(repo, load_manifest(store, spec).files, partial(pinned_bytes, store))


async def resume(run_id: str, *, on_event: OnEvent | None = None) -> RunOutcome:
    return await _drive(None, run_id, on_event)


async def approve(run_id: str, *, reject: bool = False,
                  on_event: OnEvent | None = None) -> RunOutcome:
    from langgraph.types import Command

    return await _drive(Command(resume={"approved": not reject}), run_id, on_event)
