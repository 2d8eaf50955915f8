"""The orchestrator: execute -> direct -> green threads (Send x N) -> attest -> adjudicate.

Side effects that must not repeat (minting attestations, AHDB writes) happen in nodes before
any interrupt, and are idempotent on replay: a green thread's run id names one run (a
resumed thread reuses a sealed run), attestations are content-addressed, and AHDB atoms are
keyed by run, round and kind. The approval interrupt lives in this parent graph
(resuming an interrupt inside a subgraph is where LangGraph's resume
bugs are; a green thread must never run twice). Progress goes out on LangGraph's custom stream
(``emit``): what the CLI shows live, never part of the state.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Literal

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Overwrite, Send, interrupt

from choir._core.failpoints import failpoint
from choir._core.ids import round_run_id, thread_run_id
from choir.director import part_plan, plan, verdicts, with_additions
from choir.director.advisor import suggest
from choir.director.lenses import nested_plan
from choir.director.rounds import Round, attest_round, crashed, run_round
from choir.evidence import leftovers
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.bytecode import remove_new_bytecode
from choir.evidence.heldout import redact
from choir.evidence.spec import (
    ADDITIONS_REPLICA,
    DIFF_LIMIT,
    approve_change,
    ensure_view,
    file_digests,
    judge_round,
    load_manifest,
    refusal_summary,
    remove_views,
)
from choir.evidence.target import target_of
from choir.evidence.tree import ensure_snapshot, remove_snapshot, snapshot, snapshot_root
from choir.exceptions import IntegrityError, UserError
from choir.executors import executor_isolation, get_executor
from choir.executors.pinned import pinned_gate
from choir.executors.spec_binds import executor_read_only
from choir.graph.adjudicate import adjudicate_node
from choir.graph.state import GreenIn, GreenOut, RunState, charge
from choir.models import (
    Mood,
    PlannedVerifier,
    SpecChange,
    Target,
    VerifierKind,
    VerifierPlan,
)
from choir.telemetry import begin, span, within


def emit(event: dict[str, Any]) -> None:
    """Progress for whoever streams the run (``choir run``'s live view); never state."""
    try:
        get_stream_writer()(event)
    except RuntimeError:  # outside a graph run (a direct call in a test): nobody listens
        pass


def _round(state: GreenIn | RunState, round_id: str, tree: Path) -> Round:
    """The plan runner's view of this round: pinned configuration, the round's id."""
    from choir.trace.step import run_trace_step

    return Round(id=round_id,
                 config=state["config"], policy=state["policy"], mood=Mood(state["mood"]),
                 target=state["target"], tree=tree, work_item=state["work_item"],
                 on_event=emit, in_process={VerifierKind.TRACE: run_trace_step},
                 base=state.get("base"))


async def green_thread(state: GreenIn) -> GreenOut:
    """One verifier in its own sandbox, through the plan runner (``choir.director.rounds``); raw
    output stays in the artifact store."""
    planned, target = state["planned"], state["target"]
    # the thread's id is {round id}-{verifier}-{replica} (fan_out): the round's id is its head
    round_id = state["run_id"].removesuffix(f"-{planned.name}-{planned.replica}")
    try:
        tree = verified_tree(Path(state["work_item"].repo), target, state.get("spec"),
                             state.get("spec_change"),
                             root=Path(state.get("snapshots") or snapshot_root()),
                             additions=planned.replica >= ADDITIONS_REPLICA,
                             full=_full(state))
        rnd = _round(state, round_id, tree)
        with within(round_id):  # its round's span (``direct``) is its parent
            [(run, _)] = await run_round(rnd, [planned], shared=True)
    except Exception as exc:  # noqa: BLE001 - no sandbox, no snapshot: evidence of nothing
        run = crashed(planned, state["run_id"], target, exc)
    return {"runs": [run]}


def _full(state: GreenIn | RunState) -> bool:
    """Whether the state's mood hashes every file again (PARANOID's ``rehash: full``)."""
    return state["policy"].moods[Mood(state["mood"])].rehash == "full"


def run_snapshots(run_id: str) -> Path:
    """A run's own folder of sealed snapshots and spec views, removed when it stops.

    Never shared by name: two runs of one tree (two work items on one base, a plan's items,
    unrelated clones) each verify their own, so one run's end, which parks its tree and
    drops its views, never takes the files from under the other's steps (a review: the
    second run's linter read an empty folder, PASSed and was ASSERTed).
    """
    return snapshot_root() / run_id


def snapshot_round(repo: Path, work_item: str, previous: Target | None, *, root: Path,
                   full: bool = False) -> Target:
    """Hash the tree the executor left and seal a snapshot of it in the same pass.

    Every green thread of the round (and nested rounds on the same tree) verifies this
    snapshot, never the live folder. The previous round's snapshot is parked first, so this
    one is built from it (``choir.evidence.store``: only the files the executor changed are
    new); its spec views are dropped when the tree changed.
    """

    if previous is not None:  # parked first: this round's tree is built from it
        remove_snapshot(root / previous.tree_hash)
    snap = snapshot(repo, root, full=full)
    if previous is not None and previous.tree_hash != snap.tree_hash:
        remove_views(root, previous.tree_hash)
    return target_of(snap, work_item)


def judge_spec(state: RunState, target: Target) -> SpecChange | None:
    """How ``target``'s tree differs from the run's pinned spec, with the view its verifiers
    read built; None for a run that pinned nothing (started before pinning existed)."""
    pin = state.get("spec")
    if not pin:
        return None
    item, root = state["work_item"], run_snapshots(state["run_id"])
    tree = ensure_snapshot(Path(item.repo), target.tree_hash, root, full=_full(state))
    return judge_round(tree, target.tree_hash, pin, item.may_change_spec,
                       state["policy"].moods[Mood(state["mood"])].spec_change, root)


def verified_tree(repo: Path, target: Target, spec: str | None = None,
                  change: SpecChange | None = None, *, root: Path, additions: bool = False,
                  full: bool = False) -> Path:
    """What a green thread verifies: the sealed snapshot of ``target``'s tree, seen through
    the pinned spec (``choir.evidence.spec``) when the run pinned one.

    After a crash the snapshot may be gone: the live tree is copied again and used only if it
    still hashes to the recorded tree; otherwise ``IntegrityError`` makes the thread
    INCONCLUSIVE, never a verification of a different tree. A pinned run with no judged
    change for this tree verifies nothing either (fail closed). ``additions``: the view with
    the work item's admitted new checks beside the pinned ones.
    """

    tree = ensure_snapshot(repo, target.tree_hash, root, full=full)
    if not spec:
        return tree
    if change is None or change.tree_hash != target.tree_hash:
        raise IntegrityError(f"no spec view was judged for tree {target.tree_hash[:12]}")
    return ensure_view(tree, spec, change, root, ArtifactStore(),
                       additions=additions)


def _green_graph() -> Any:
    builder = StateGraph(GreenOut, input_schema=GreenIn, output_schema=GreenOut)
    builder.add_node("verify", green_thread)
    builder.add_edge(START, "verify")
    builder.add_edge("verify", END)
    return builder.compile()


async def execute(state: RunState) -> dict[str, Any]:
    """One executor attempt, sandboxed; a mood that forbids an unsandboxed one refuses it.

    The executor's sandbox (and every process it started) is gone when this returns, so the
    tree the verifiers see cannot change under them. A failing executor is recorded (exit
    code, timed out) and verification still runs: the evidence decides, not the executor.
    """

    item = state["work_item"]
    attempt = state.get("attempt", 0) + 1
    budget = charge(state)
    mood = Mood(state["mood"])
    isolation = executor_isolation(item.executor)
    if isolation == "none" and not state["policy"].moods[mood].allow_unsafe_isolation:
        raise UserError(f"mood {mood.value} refuses an unsandboxed executor (work item "
                        f"{item.id}); install bubblewrap, or drop 'sandbox: none' under "
                        "'executor:', or choose another mood")
    emit({"kind": "execute", "work_item": item.id, "attempt": attempt, "state": "running",
          "isolation": isolation})
    run_id = state["run_id"] if item.split_of is None else f"{state['run_id']}-{item.id}"

    # the kernel stamps a ctime from its coarse clock, a tick behind this one: a second's
    # margin (a cache the user's own run wrote just before is only made again)
    began_ns = time.time_ns() - 1_000_000_000
    read_only: tuple[Path, ...] = ()
    pin = state.get("spec")
    if pin:
        manifest = load_manifest(ArtifactStore(), pin)
        read_only = tuple(executor_read_only(Path(item.repo), manifest, item.may_change_spec))
    # what this executor writes is never a later run's pinned spec, even if this run
    # stops before its round records it (``choir.evidence.leftovers``)
    await asyncio.to_thread(leftovers.begin, Path(item.repo), state["run_id"])
    with (span("choir.executor.attempt", {
            "choir.work_item": item.id, "choir.attempt": attempt,
            "choir.executor": item.executor.kind, "choir.isolation": isolation},
            parent=state["run_id"]) as tel,
          pinned_gate(state["config"], state["policy"], Mood(state["mood"]), read_only)):
        output = await asyncio.to_thread(get_executor(item.executor.kind), item, attempt,
                                         redact(state.get("feedback", []),
                                                state["config"].verifiers), run_id=run_id)
        tel.set({"choir.executor.exit_code": output.exit_code,
                 "choir.executor.timed_out": output.timed_out,
                 "choir.isolation": output.isolation})
    failpoint("execute:done")
    ended = ("timed out" if output.timed_out else
             "done" if output.exit_code is None else f"exited {output.exit_code}")
    # bytecode is loaded in place of its source and no check reads it (review 18b #4)
    bytecode = await asyncio.to_thread(remove_new_bytecode, Path(item.repo), began_ns)
    emit({"kind": "execute", "work_item": item.id, "attempt": attempt, "state": "done",
          "exit_code": output.exit_code, "timed_out": output.timed_out,
          "isolation": output.isolation, "output": output.artifact,
          "removed_bytecode": bytecode[:20]})
    target = snapshot_round(Path(item.repo), item.id, state.get("target"),
                            root=run_snapshots(state["run_id"]), full=_full(state))
    change = judge_spec(state, target)
    await asyncio.to_thread(_record_written, state, target, change)
    spec_events = []
    if change is not None and change.changed:
        spec_events.append(f"spec changed ({refusal_summary(change)}): "
                           + ("refused" if change.refused else
                              "held for a person" if change.held else "additions admitted"))
    hold = change is not None and bool(change.held) and not change.refused
    before = state.get("target")
    # ``runs`` are every run on this tree: an attempt that left the item's tree as it was
    # keeps them, so a verdict over this tree (a failing run dressed as a crash beside a
    # PASS: FLAKY) is not forgotten by asking the executor again (review 17b)
    same = before is not None and state.get("runs") and \
        (before.tree_hash, before.work_item) == (target.tree_hash, target.work_item)
    fresh = {} if same else {"nested": 0, "runs": Overwrite([]), "attestations": {}}
    return {**budget, "attempt": attempt, "target": target, "executor_output": output.artifact,
            "spec_change": change, "status": "awaiting_approval" if hold else "running",
            "executor_exit": output.exit_code, "executor_timed_out": output.timed_out,
            "executor_isolation": output.isolation,
            "usage": [("executor", u) for u in output.usage], **fresh,
            "round_kind": "primary",
            "events": [f"execute {item.id} attempt {attempt}: executor {ended} "
                       f"(isolation {output.isolation})",
                       *([f"removed the executor's bytecode: {', '.join(bytecode[:20])}"]
                         if bytecode else []), *spec_events]}


def _record_written(state: RunState, target: Target, change: SpecChange | None) -> None:
    """The spec files the executor added or changed, as the sealed snapshot holds them."""
    repo = Path(state["work_item"].repo)
    rels = (*change.added, *change.ignored, *change.modified) if change is not None else ()
    written = file_digests(
        ensure_snapshot(repo, target.tree_hash, run_snapshots(state["run_id"]),
                        full=_full(state)), rels) if rels else {}
    leftovers.record(repo, state["run_id"], written)


def after_execute(state: RunState) -> str:
    """A held spec change waits for a person before anything is verified on it."""
    change = state.get("spec_change")
    held = change is not None and change.held and not change.refused and not change.approved
    return "approve_spec" if held else "direct"


def approve_spec(state: RunState) -> Command[Literal["direct", "__end__"]]:
    """The approval interrupt for a held spec change, the diff attached.

    Approved: the changed files become the pin from now on, and the round is verified with
    them. Rejected: the run ends; nothing is ASSERTed.
    """
    change = state["spec_change"]
    assert change is not None
    diff = (ArtifactStore().read_bytes(change.diff, limit=DIFF_LIMIT).decode("utf-8", "replace")
            if change.diff else "")
    answer = interrupt({"work_item": state["work_item"].id, "spec_change":
                        change.model_dump(mode="json"), "diff": diff})
    if not (isinstance(answer, dict) and answer.get("approved")):
        return Command(goto="__end__", update={
            "status": "rejected", "reason": "a person rejected the spec change",
            "events": [f"spec change rejected by a person: {refusal_summary(change)}"]})
    item, held_pin = state["work_item"], state.get("spec")
    assert held_pin  # a change is judged only against a pin
    root = run_snapshots(state["run_id"])
    tree = ensure_snapshot(Path(item.repo), change.tree_hash, root, full=_full(state))
    pin, approved = approve_change(tree, held_pin, change, root)
    return Command(goto="direct", update={
        "spec": pin, "spec_change": approved, "status": "running",
        "events": [f"spec change approved by a person: {refusal_summary(change)}; "
                   f"new pin {pin[:12]}"]})


async def direct(state: RunState) -> dict[str, Any]:
    """The Director picks this round's green threads (and may ask its model)."""
    item = state["work_item"]
    config, policy = state["config"], state["policy"]
    mood = Mood(state["mood"])
    kind = state.get("round_kind", "primary")
    runs = state.get("runs", [])
    usage: list[Any] = []
    need = policy.moods[mood].reruns
    floor = list(state.get("floor", []))
    round_id = round_run_id(state["run_id"], state.get("round", 0))
    # the round's span: closed by adjudication, the parent of its plan's green threads
    begin(round_id, "choir.round", {
        "choir.round": round_id, "choir.round.kind": kind, "choir.mood": mood.value,
        "choir.work_item": item.id,
        "choir.tree_hash": state["target"].tree_hash if state.get("target") else None},
        parent=state["run_id"])
    if kind == "nested":
        chosen = VerifierPlan(mood=mood, verifiers=tuple(nested_plan(
            verdicts(runs, need), runs, config.verifiers, need)),
            reason=f"nested round {state.get('nested', 0)}: other lenses")
    elif kind == "broaden":
        done = {r.verifier for r in runs}
        chosen = VerifierPlan(mood=mood, reason="BOLD: the core is green, broadening",
                              verifiers=tuple(PlannedVerifier(name=n, replica=r) for n in
                                              policy.moods[mood].broaden if n not in done
                                              for r in range(need)))
    elif item.split_of is not None:
        chosen = part_plan(item, policy, mood, config.verifiers)
    else:
        # the floor: a mood switch may add verifiers, never drop one an earlier round ran
        required = tuple(dict.fromkeys([*item.required_verifiers, *floor]))
        chosen = plan(policy, mood, config.verifiers, required=required)
        if config.models.director:
            with within(round_id):
                advice = await suggest(config.models.director, item, mood=mood,
                                       attempt=state.get("attempt", 1),
                                       planned=[p.name for p in chosen.verifiers
                                                if p.replica == 0],
                                       specs=config.verifiers,
                                       last=redact(state.get("feedback", []),
                                                   config.verifiers))
            usage.append(("director", advice.usage))
            chosen = plan(policy, mood, config.verifiers, required=required,
                          suggestion=advice.names, reason=advice.reason)
    if kind != "nested":
        chosen = with_additions(chosen, state.get("spec_change"))
    emit({"kind": "plan", "work_item": item.id, "mood": mood.value, "round_kind": kind,
          "verifiers": [f"{p.name}#{p.replica}" + ("" if p.lens == "default" else f" ({p.lens})")
                        for p in chosen.verifiers],
          "dropped": list(chosen.dropped), "reason": chosen.reason})
    event = f"plan ({kind}): {', '.join(p.name for p in chosen.verifiers) or 'nothing'}"
    if chosen.dropped:
        event += f"; dropped, never run: {', '.join(chosen.dropped)}"
    event += f"; why: {chosen.reason}"
    if kind != "nested" and item.split_of is None:
        floor = list(dict.fromkeys([*floor, *(p.name for p in chosen.verifiers)]))
    return {"plan": chosen, "floor": floor, "usage": usage, "events": [event]}


def fan_out(state: RunState) -> list[Send] | str:
    """One green thread per planned verifier; an empty plan goes straight to judgement."""
    item = state["work_item"]
    round_no = state.get("round", 0)
    sends = [Send("green", GreenIn(
        work_item=item, config=state["config"], policy=state["policy"], planned=pv,
        target=state["target"], mood=state["mood"], spec=state.get("spec"),
        base=state.get("base"),
        spec_change=state.get("spec_change"), snapshots=str(run_snapshots(state["run_id"])),
        run_id=thread_run_id(round_run_id(state["run_id"], round_no), pv.name, pv.replica)))
        for pv in state["plan"].verifiers]
    return sends or "attest"


async def attest(state: RunState) -> dict[str, Any]:
    """Mint an attestation for every run on this tree that has none yet."""

    minted = dict(state.get("attestations", {}))
    runs = state.get("runs", [])
    rnd = _round(state, round_run_id(state["run_id"], state.get("round", 0)),
                 Path(state["work_item"].repo))
    change = state.get("spec_change")
    with within(rnd.id):
        fresh = attest_round(rnd, runs, minted=minted,
                             executor_isolation=state.get("executor_isolation"),  # type: ignore[arg-type]
                             spec_hash=state.get("spec"),
                             spec_change=change if change is not None
                             and change.tree_hash == state["target"].tree_hash else None)
    minted.update({run_id: att.id for run_id, att in fresh.items()})
    usage = [("reporter", run.report.usage) for run in runs
             if run.run_id in fresh and run.report.usage.model]
    failpoint("attest:minted")
    new = len(minted) - len(state.get("attestations", {}))
    events = [f"attested {new}"]
    from choir.verification.session import seal_round

    round_id = rnd.id
    this_round = [r for r in state.get("runs", []) if r.run_id.startswith(round_id + "-")]
    if seal_round(round_id, this_round, minted, mood=state["mood"]):
        events.append(f"episode sealed: runs/{round_id}/manifest.json")
    return {"attestations": minted, "usage": usage, "events": events}


def approve(state: RunState) -> dict[str, Any]:
    """A person's answer: to an ASSERT above the approval radius, or to an escalation (the
    work item the loop could not satisfy, with its evidence). An escalation is never
    ASSERTed by an answer: approving it records that a person took the work item."""
    escalation = state.get("escalation")
    answer = interrupt({"work_item": state["work_item"].id, "asserted": state.get("asserted"),
                        **({"escalation": escalation} if escalation else {})})
    ok = bool(answer.get("approved")) if isinstance(answer, dict) else False
    if escalation:
        return {"status": "escalated" if ok else "rejected",
                "events": ["a person took the escalated work item" if ok else
                           "the escalation was rejected by a human"]}
    held = state.get("held")
    if not ok:
        return {"status": "rejected", "held": None, "events": ["rejected by a human"]}
    if not isinstance(held, dict):  # a run that waited under an older Choir: its ASSERT was
        return {"status": "asserted", "events": ["approved"]}  # written before it asked
    from choir.ahdb import open_ahdb
    from choir.graph.adjudicate import assert_done

    # the ASSERT the round earned, written now that a person approved (keyed: once)
    required = held.get("required")
    asserted = assert_done(open_ahdb(), state,
                           [str(v) for v in required] if isinstance(required, list) else [],
                           str(held["key"]))
    return {"status": "asserted", "asserted": asserted, "held": None, "events": ["approved"]}


def build() -> Any:
    builder = StateGraph(RunState)
    builder.add_node("execute", execute)
    builder.add_node("direct", direct)
    builder.add_node("green", _green_graph())
    builder.add_node("attest", attest)
    builder.add_node("adjudicate", adjudicate_node)
    builder.add_node("approve", approve)
    builder.add_node("approve_spec", approve_spec)
    builder.add_edge(START, "execute")
    builder.add_conditional_edges("execute", after_execute, ["approve_spec", "direct"])
    builder.add_conditional_edges("direct", fan_out, ["green", "attest"])
    builder.add_edge("green", "attest")
    builder.add_edge("attest", "adjudicate")
    builder.add_edge("approve", END)
    return builder
